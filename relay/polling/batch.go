package polling

import (
	"context"
	"slices"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/internal/delivery"
)

// relayBatch publishes rows. When the whole batch was ACKed it returns the
// marker job for the caller to run; otherwise it marks what may be marked,
// parks what was rejected for good and backs off on retryable failures
// itself. It returns errCrash only when the crash hook fired. carry are
// the rows of the marker still in flight, which an exactly-once publish
// records as unmarked.
func (r *Relay) relayBatch(ctx context.Context, rows []core.OutboxRow, carry []core.RowRef) (*markJob, error) {
	batch := core.Envelopes(rows)
	if h := r.hooks.BeforePublish; h != nil {
		h(batch)
	}
	// Publish only what the standbys have: a failover must not promote a
	// ledger that lacks an event the world has seen. Held past the next
	// lease round trip, the batch is dropped and read again after it.
	if r.standby != nil {
		until := r.nextMaintain
		if soon := time.Now().Add(r.cfg.StandbyFlush.PollMax); until.Before(soon) {
			until = soon
		}
		_, ok, err := r.standby.Wait(ctx, r.life, 0, until)
		if err != nil {
			r.log.Error("standby flush", "err", err)
			r.backoff(ctx)
			return nil, nil
		}
		if !ok {
			return nil, nil
		}
		// The ledger may have failed over while the batch was held: its
		// rows came from the old primary, and one the new history lacks
		// would be a ghost. The next round reads them again from the new
		// one (once its history is accepted).
		if !r.history.Accepted(ctx) {
			return nil, nil
		}
	}
	// A relay that was paused (SIGSTOP, GC, a stalled hook) may have lost its
	// leases meanwhile: publishing now could interleave with the new owner's
	// sends. Abandon instead, and let the next lease round trip decide.
	if margin := r.cfg.LeaseTTL / 10; time.Until(r.deadline) < margin {
		r.m.AbandonedBatches.Inc()
		r.log.Warn("abandoning batch: leases expire before it could be published", "rows", len(rows),
			"lease_deadline_in", time.Until(r.deadline).String())
		r.nextMaintain = time.Time{}
		return nil, nil
	}
	if r.hooks.UnsafeMarkBeforeAck {
		return nil, r.unsafeMarkThenPublish(ctx, rows, batch)
	}
	start := time.Now()
	err := delivery.PublishUntil(ctx, r.deadline, r.sink, r.fences, rows, batch, carry)
	r.m.PublishSeconds.Observe(time.Since(start).Seconds())
	r.m.BatchSize.Observe(float64(len(batch)))
	if ctx.Err() != nil {
		return nil, nil // hard stop: nothing is marked, everything will be resent
	}

	// Mark only records with no failed predecessor of the same aggregate in
	// this batch: a later revision must not be marked while an earlier one
	// is still to be sent.
	st, failed := delivery.Settle(batch, err)
	var refs []core.RowRef
	for _, i := range st.Mark {
		refs = append(refs, rows[i].RowRef)
	}
	r.m.PublishedTotal.Add(float64(st.Acked))

	if st.Acked > 0 {
		if h := r.hooks.AfterAck; h != nil {
			if herr := h(batch); herr != nil {
				return nil, errCrash
			}
		}
	}
	var job *markJob
	if len(refs) > 0 {
		if h := r.hooks.BeforeMarker; h != nil {
			h()
		}
		job = &markJob{refs: refs, leases: slices.Clone(r.leases)}
	}
	// A record that keeps failing retryably while the sink takes the others
	// parks its aggregate, so it stops throttling every other aggregate.
	stuck := r.stuck.Observe(batch, err, st)
	if failed == 0 {
		r.retry.Reset()
		return job, nil
	}
	if job != nil {
		r.awaitMark(r.startMark(ctx, job))
	}
	for _, p := range st.Parks {
		isNew, perr := r.store.Park(ctx, p)
		if perr != nil {
			r.log.Error("park aggregate", "aggregate_type", p.AggregateType, "aggregate_id", p.AggregateID, "err", perr)
			continue
		}
		if isNew {
			r.m.Parked.Inc()
		}
		r.log.Error("aggregate parked: the sink rejected its record for good; other aggregates keep flowing; release with `posthorn outbox release`",
			"aggregate_type", p.AggregateType, "aggregate_id", p.AggregateID, "event_id", p.EventID, "reason", p.Reason)
	}
	stuckParked := map[core.AggregateKey]bool{}
	for _, p := range stuck {
		isNew, perr := r.store.Park(ctx, p)
		if perr != nil {
			r.log.Error("park aggregate", "aggregate_type", p.AggregateType, "aggregate_id", p.AggregateID, "err", perr)
			continue
		}
		stuckParked[p.Key()] = true
		if isNew {
			r.m.Parked.Inc()
		}
		r.log.Error("aggregate parked: its record kept failing retryably while the sink took others; other aggregates keep flowing; release with `posthorn outbox release`",
			"aggregate_type", p.AggregateType, "aggregate_id", p.AggregateID, "event_id", p.EventID, "reason", p.Reason)
	}
	if st.Retryable != nil && allParked(batch, st.Retry, stuckParked) {
		// Every record left to retry belongs to an aggregate parked now:
		// nothing to wait for.
		r.retry.Reset()
		return nil, nil
	}
	if st.Retryable != nil {
		r.m.Retries.Inc()
		r.log.Warn("sink failed; retrying with backoff", "failed", failed, "batch", len(batch), "err", st.Retryable)
		r.backoff(ctx)
		return nil, nil
	}
	r.retry.Reset()
	return nil, nil
}

// allParked reports whether every record of batch at indexes idx belongs
// to an aggregate in parked.
func allParked(batch []core.Envelope, idx []int, parked map[core.AggregateKey]bool) bool {
	if len(parked) == 0 {
		return false
	}
	for _, i := range idx {
		if !parked[batch[i].Aggregate()] {
			return false
		}
	}
	return true
}
