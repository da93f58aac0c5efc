package core

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TraceHeaders returns the W3C trace context of ctx's span (the Posting
// API's, or a publish package caller's) as outbox headers, so that the
// relay's publish span continues that trace; nil when ctx has no span,
// which is always the case with tracing off: then no row carries a trace
// header. The format is W3C Trace Context, adapters/tracing.Propagator's;
// the OpenTelemetry API alone writes it, so no writer of outbox rows
// depends on the SDK.
func TraceHeaders(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := make(map[string]string, 2)
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(h))
	return h
}
