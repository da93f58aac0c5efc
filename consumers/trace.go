package consumers

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/core"
)

// Tracing: each delivery to a handler runs in an apply span, a child of
// the trace context the record carries (W3C traceparent, put there by the
// relay's publish span), from the moment it joins its lane's queue until
// its disposition is committed: the inbox transaction and the handler are
// inside it. A retried delivery gets a span per attempt. The handler's ctx
// carries the span of the batch's first delivery; in a batch of one, its
// own.

// tracerName is the instrumentation scope of the consumers' spans.
const tracerName = "github.com/posthorn/posthorn/consumers"

// startApply starts the apply span of one delivery; with tracing off it
// returns ctx and a nil span.
func (r *Registry) startApply(ctx context.Context, hc *handlerConfig, msg *message.Message, e core.Envelope) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, nil
	}
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(msg.Metadata))
	return r.tracer.Start(ctx, "apply "+hc.consumer, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", hc.topic),
			attribute.String("messaging.consumer.group.name", hc.consumer),
			attribute.String("messaging.message.id", e.EventID),
			attribute.String("posthorn.aggregate_type", e.AggregateType),
			attribute.String("posthorn.aggregate_id", e.AggregateID),
			attribute.Int64("posthorn.revision", e.Revision),
		))
}

// endApply ends span (nil: tracing off) with the delivery's disposition,
// or its error.
func endApply(span trace.Span, out Outcome, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "not applied")
	} else {
		span.SetAttributes(attribute.String("posthorn.disposition", string(out.Disposition)))
	}
	span.End()
}
