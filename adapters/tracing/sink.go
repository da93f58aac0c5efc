package tracing

import (
	"context"
	"errors"
	"maps"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
)

// Attribute keys of Posthorn's own span attributes (beside OpenTelemetry's
// messaging.* names).
const (
	AttrAggregateType = attribute.Key("posthorn.aggregate_type")
	AttrAggregateID   = attribute.Key("posthorn.aggregate_id")
	AttrRevision      = attribute.Key("posthorn.revision")
	AttrJournalID     = attribute.Key("posthorn.journal_id")
	// AttrRepeat is true on a replay's or an operator's resend's record.
	AttrRepeat = attribute.Key("posthorn.repeat")
	// AttrShard is the envelope's outbox shard (core.ShardOf).
	AttrShard = attribute.Key("posthorn.shard")
)

// Sink returns inner with a publish span per envelope, or inner itself when
// tp is nil (tracing off). system names the sink in messaging.system.
//
// Each span's parent is the trace context in the envelope's headers (the
// outbox row's), or ctx's span when the row has none; the envelope goes to
// inner with the publish span's context in its traceparent instead, on a
// copy of its headers: the caller's batch is never changed, so a retry of
// the same batch starts from the row's context again. A span ends when
// inner returns, with an error status when its record failed (a
// *core.BatchError names which; any other error fails them all).
//
// It is a relay.Wrap, so over a relay.FencedSink the result is one too,
// and the relay's exactly-once mode still finds it.
func Sink(inner core.Sink, tp trace.TracerProvider, system string) core.Sink {
	if tp == nil {
		return inner
	}
	tracer := tp.Tracer(ScopeName)
	return relay.Wrap(inner, func(ctx context.Context, batch []core.Envelope, publish relay.PublishFunc) error {
		traced, spans := start(ctx, tracer, system, batch)
		err := publish(ctx, traced)
		end(spans, err)
		return err
	})
}

// start opens one publish span per envelope and returns the envelopes
// carrying their span's context.
func start(ctx context.Context, tracer trace.Tracer, system string, batch []core.Envelope) ([]core.Envelope, []trace.Span) {
	traced := make([]core.Envelope, len(batch))
	spans := make([]trace.Span, len(batch))
	for i, e := range batch {
		parent := Propagator.Extract(ctx, propagation.MapCarrier(e.Headers))
		sctx, span := tracer.Start(parent, "publish "+e.Topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", system),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", e.Topic),
				attribute.String("messaging.message.id", e.EventID),
				AttrAggregateType.String(e.AggregateType),
				AttrAggregateID.String(e.AggregateID),
				AttrRevision.Int64(e.Revision),
				AttrJournalID.String(e.JournalID),
				AttrShard.Int(core.ShardOf(e.AggregateID)),
				AttrRepeat.Bool(e.OperatorRepeat()),
			))
		h := make(map[string]string, len(e.Headers)+2)
		maps.Copy(h, e.Headers)
		// The publish span's context replaces the row's; a tracestate the
		// span does not carry must not survive from the row.
		delete(h, HeaderTraceparent)
		delete(h, HeaderTracestate)
		Propagator.Inject(sctx, propagation.MapCarrier(h))
		e.Headers = h
		traced[i], spans[i] = e, span
	}
	return traced, spans
}

// end ends every span, with the failure of its record if it failed.
func end(spans []trace.Span, err error) {
	var be *core.BatchError
	perRecord := errors.As(err, &be)
	for i, span := range spans {
		failure := err
		if perRecord {
			failure = be.Failed[i]
		}
		if failure != nil {
			span.RecordError(failure)
			span.SetStatus(codes.Error, "not acknowledged by the sink")
		}
		span.End()
	}
}
