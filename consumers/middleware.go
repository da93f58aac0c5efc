package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/core"
)

// middleware is the inbox around one handler: decode, kind check, inbox
// transaction, poison parking, metrics, and draining of held successors.
func (r *Registry) middleware(hc *handlerConfig) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		// Messages join the batch queue in delivery order (see batch.go);
		// every other path lets the next message through at once.
		d, sequenced := ctx.Value(seqKey{}).(*delivery)
		if sequenced {
			hc.handOff.wait(ctx, d.seq)
			defer hc.handOff.pass(d.seq)
		} else {
			d = &delivery{}
			d.e, d.err = core.EnvelopeFromMessage(msg)
		}
		e, err := d.e, d.err
		if err != nil {
			return r.reject(ctx, hc, msg, e, err.Error())
		}
		if e.Kind != hc.kind {
			return r.reject(ctx, hc, msg, e, fmt.Sprintf("record of kind %s delivered to %s handler %s on %s", e.Kind, hc.kind, hc.consumer, hc.topic))
		}
		e.Topic = hc.topic
		ctx, span := r.startApply(ctx, hc, msg, e)
		if hc.noInbox {
			if sequenced {
				hc.handOff.pass(d.seq)
			}
			err := r.applyWithoutInbox(ctx, hc, e)
			endApply(span, Outcome{Disposition: core.DispositionApplied}, err)
			return err
		}
		lane := hc.lanes.of(e)
		p := lane.enqueue(ctx, e)
		if sequenced {
			hc.handOff.pass(d.seq)
		}
		// The batch counts the outcome and drains the successors of what
		// it applied.
		out, err := p.outcome()
		endApply(span, out, err)
		if err != nil {
			return r.failed(ctx, hc, err)
		}
		return nil
	}
}

// apply wraps the team's handler with the latency and lag metrics.
func (r *Registry) apply(hc *handlerConfig) Handler {
	return func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		start := time.Now()
		err := hc.handler(ctx, tx, e)
		if err == nil {
			hc.metrics.observe(time.Since(start), e.OccurredAt)
		}
		return err
	}
}

// failed handles a failed Receive: a permanent handler error parks the
// event and acknowledges; anything else goes back to Retry.
func (r *Registry) failed(ctx context.Context, hc *handlerConfig, err error) error {
	var ae *ApplyError
	if !errors.As(err, &ae) || !core.IsPermanent(ae.Err) {
		return err
	}
	out, perr := r.inbox.ParkPoison(ctx, hc.consumer, hc.ordered, ae.Envelope, ae.Err.Error())
	if perr != nil {
		return errors.Join(err, perr)
	}
	r.recorded(hc, out)
	return nil
}

func (r *Registry) reject(ctx context.Context, hc *handlerConfig, msg *message.Message, e core.Envelope, reason string) error {
	id := e.EventID
	if id == "" {
		id = msg.Metadata.Get(core.HeaderEventID)
	}
	if id == "" {
		id = msg.UUID
	}
	if id == "" {
		// Nothing to key an inbox row on: count, log and drop, since
		// redelivering it can never make it applicable.
		r.metrics.record(hc.consumer, core.DispositionRejected, 1)
		r.log.Warn("consumer rejected a record without an event ID", "consumer", hc.consumer, "topic", hc.topic, "reason", reason)
		return nil
	}
	out, err := r.inbox.Reject(ctx, hc.consumer, id, e, msg.Metadata, msg.Payload, reason)
	if err != nil {
		return err
	}
	r.recorded(hc, out)
	return nil
}

func (r *Registry) applyWithoutInbox(ctx context.Context, hc *handlerConfig, e core.Envelope) error {
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error { return r.apply(hc)(ctx, tx, e) })
	if err != nil {
		return err
	}
	r.metrics.record(hc.consumer, core.DispositionApplied, 1)
	r.applied(hc)
	return nil
}

// FirstAppliedLogMessage is logged once per handler, at the first event
// it applied since Run started, with the time it took ("after"): how long a
// restarted consumer took to apply again (the fault suite reads it).
const FirstAppliedLogMessage = "consumer applied its first event since start"

// applied logs hc's first applied event.
func (r *Registry) applied(hc *handlerConfig) {
	hc.firstApplied.Do(func() {
		r.log.Info(FirstAppliedLogMessage, "consumer", hc.consumer, "topic", hc.topic, "after", time.Since(r.started).Round(time.Millisecond).String())
	})
}

// RevisionConflictLogMessage is logged at ERROR for every revision
// conflict, with both event IDs (event_id, applied_event_id), the aggregate
// and the revision.
const RevisionConflictLogMessage = "consumer received a revision already applied under another event ID: not applied, recorded as revision_conflict"

// SkippedLogMessage is logged at WARN for every skip marker recorded as
// skipped: an operator dead-lettered that revision (posthorn outbox
// dead-letter), and the consumer advanced past it without its effect.
const SkippedLogMessage = "consumer skipped a dead-lettered revision: recorded as skipped, its effect is not applied"

// recorded turns one outcome into metrics and log lines.
func (r *Registry) recorded(hc *handlerConfig, out Outcome) {
	r.metrics.record(hc.consumer, out.Disposition, 1)
	r.logged(hc, out)
}

// logged logs one outcome: the first applied event since start, and every
// disposition but applied at its level (the attributes are built only
// when the logger takes the level).
func (r *Registry) logged(hc *handlerConfig, out Outcome) {
	var (
		level slog.Level
		msg   string
	)
	switch out.Disposition {
	case core.DispositionApplied:
		r.applied(hc)
		return
	case core.DispositionHeld:
		r.metrics.gaps.WithLabelValues(hc.consumer).Inc()
		level, msg = slog.LevelInfo, "consumer holds an event received ahead of its predecessor"
	case core.DispositionParkedGap:
		level, msg = slog.LevelWarn, "consumer parked an event behind a parked aggregate"
	case core.DispositionParkedPoison:
		level, msg = slog.LevelError, "consumer parked a poison event"
	case core.DispositionRejected:
		level, msg = slog.LevelWarn, "consumer rejected a record"
	case core.DispositionDuplicate:
		level, msg = slog.LevelDebug, "consumer absorbed a duplicate"
	case core.DispositionSkipped:
		level, msg = slog.LevelWarn, SkippedLogMessage
	case core.DispositionRevisionConflict:
		level, msg = slog.LevelError, RevisionConflictLogMessage
	default:
		return
	}
	ctx := context.Background()
	if !r.log.Enabled(ctx, level) {
		return
	}
	attrs := []any{"consumer", hc.consumer, "event_id", out.EventID, "aggregate_type", out.AggregateType,
		"aggregate_id", out.AggregateID, "revision", out.Revision, "reason", out.Reason}
	if out.Disposition == core.DispositionRevisionConflict {
		attrs = append(attrs, "applied_event_id", out.ConflictsWith)
	}
	r.log.Log(ctx, level, msg, attrs...)
}

// applyAll is the handler's BatchHandler with the metrics and a panic
// turned into an error; nil when the handler has none.
func (r *Registry) applyAll(hc *handlerConfig) BatchHandler {
	if hc.batch == nil {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx, es []core.Envelope) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("batch handler panicked: %v", p)
			}
		}()
		start := time.Now()
		if err := hc.batch(ctx, tx, es); err != nil {
			return err
		}
		// Each event's share of the batch's time; the lag is the last
		// event's.
		per := time.Since(start) / time.Duration(len(es))
		for range len(es) - 1 {
			hc.metrics.observe(per, time.Time{})
		}
		hc.metrics.observe(per, es[len(es)-1].OccurredAt)
		return nil
	}
}

// safeApply is apply for re-drives, which run outside Watermill's
// Recoverer: a panic becomes an error so the sweeper survives it.
func (r *Registry) safeApply(hc *handlerConfig) Handler {
	apply := r.apply(hc)
	return func(ctx context.Context, tx pgx.Tx, e core.Envelope) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("handler panicked: %v", p)
			}
		}()
		return apply(ctx, tx, e)
	}
}
