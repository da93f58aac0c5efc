package consumers

import (
	"context"
	"errors"
	"time"

	"github.com/posthorn/posthorn/core"
)

// Held events are re-driven here: by drain after an applied predecessor,
// by each consumer's sweeper (parking expired holds, draining runnable
// aggregates, refreshing the gauges), and by an operator's release.

// drain re-drives the held events of one aggregate; failures are logged
// and left to the sweeper, except permanent ones, which park.
func (r *Registry) drain(ctx context.Context, hc *handlerConfig, ref core.AggregateKey) {
	for {
		outs, err := r.inbox.Drain(ctx, hc.consumer, hc.ordered, ref.Type, ref.ID, r.safeApply(hc))
		for _, o := range outs {
			r.recorded(hc, o)
		}
		if err == nil {
			return
		}
		var ae *ApplyError
		if errors.As(err, &ae) && core.IsPermanent(ae.Err) {
			out, perr := r.inbox.ParkPoison(ctx, hc.consumer, hc.ordered, ae.Envelope, ae.Err.Error())
			if perr == nil {
				r.recorded(hc, out)
				if !hc.ordered {
					continue // other held events of the aggregate do not depend on it
				}
				return
			}
			err = perr
		}
		if ctx.Err() == nil {
			r.log.Warn("consumer could not re-drive held events; the sweeper retries", "consumer", hc.consumer,
				"aggregate_type", ref.Type, "aggregate_id", ref.ID, "error", err)
		}
		return
	}
}

// sweep is one consumer's background loop: park aggregates whose hold
// expired, re-drive held events whose predecessor is applied (released
// parks, drains another instance left unfinished), and refresh the gauges.
func (r *Registry) sweep(ctx context.Context, hc *handlerConfig) {
	t := time.NewTicker(r.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.SweepOnce(ctx, hc.consumer); err != nil && ctx.Err() == nil {
			r.log.Warn("consumer sweep failed", "consumer", hc.consumer, "error", err)
		}
	}
}

// SweepOnce runs one sweep of consumer's handlers now (Run does this every
// SweepInterval).
func (r *Registry) SweepOnce(ctx context.Context, consumer string) error {
	for _, hc := range r.inboxHandlers(consumer) {
		if hc.ordered {
			parked, err := r.inbox.ParkExpiredHolds(ctx, hc.consumer, hc.hold)
			for _, p := range parked {
				r.metrics.record(hc.consumer, core.DispositionParkedGap, p.Events)
				r.log.Warn("consumer parked an aggregate: its predecessor did not arrive within the hold time",
					"consumer", hc.consumer, "aggregate_type", p.Type, "aggregate_id", p.ID,
					"events", p.Events, "hold", hc.hold.String(), "reason", p.Reason)
			}
			if err != nil {
				return err
			}
		}
		refs, err := r.inbox.Runnable(ctx, hc.consumer, hc.ordered)
		if err != nil {
			return err
		}
		for _, ref := range refs {
			r.drain(ctx, hc, ref)
		}
		held, parked, err := r.inbox.Waiting(ctx, hc.consumer)
		if err != nil {
			return err
		}
		r.metrics.held.WithLabelValues(hc.consumer).Set(float64(held))
		r.metrics.parked.WithLabelValues(hc.consumer).Set(float64(parked))
	}
	return nil
}

// inboxHandlers are consumer's handlers that record in the inbox.
func (r *Registry) inboxHandlers(consumer string) []*handlerConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	var hcs []*handlerConfig
	for _, hc := range r.handlers {
		if hc.consumer == consumer && !hc.noInbox {
			hcs = append(hcs, hc)
		}
	}
	return hcs
}

// Release lifts the park of one account for consumer and re-drives its
// events in revision order at once (from this process; without it the
// consumer's sweeper does so within SweepInterval). It returns how many
// parked events were released.
func (r *Registry) Release(ctx context.Context, consumer, account string) (int, error) {
	return r.ReleaseAggregate(ctx, consumer, core.AggregateAccount, account)
}

// ReleaseAggregate is Release for any aggregate type (commands are ordered
// within their journal).
func (r *Registry) ReleaseAggregate(ctx context.Context, consumer, aggregateType, aggregateID string) (int, error) {
	n, err := r.inbox.Release(ctx, consumer, aggregateType, aggregateID)
	if err != nil {
		return 0, err
	}
	r.log.Info("consumer released an aggregate", "consumer", consumer, "aggregate_type", aggregateType,
		"aggregate_id", aggregateID, "events", n)
	for _, hc := range r.inboxHandlers(consumer) {
		r.drain(ctx, hc, core.AggregateKey{Type: aggregateType, ID: aggregateID})
	}
	return n, nil
}
