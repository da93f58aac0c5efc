package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/internal/delivery"
	"github.com/posthorn/posthorn/relay/internal/historyhold"
	"github.com/posthorn/posthorn/relay/internal/relaymetrics"
)

// This file publishes streamed rows, marks what the sink ACKed under the
// slot lease, parks what it rejected for good, and keeps the gauges.

// deliver publishes rows in order in batches of BatchSize, marks what was
// ACKed (fenced by the slot lease), parks what the sink rejected for good
// and retries the rest with backoff until it is ACKed. It returns only
// when every row is marked or parked, or with the reason it could not.
// With StandbyFlush required nothing is published before the standbys have
// flushed WAL up to commit, a position at or past the commit of every row
// (0: the WAL insert position when the wait starts).
func (r *Relay) deliver(ctx context.Context, rows []core.OutboxRow, commit LSN) error {
	if len(rows) > 0 {
		if err := r.awaitHistory(ctx); err != nil {
			return err
		}
		if err := r.awaitStandbys(ctx, commit); err != nil {
			return err
		}
		// The ledger may have failed over while the rows were held: they
		// came from the old primary's stream. The session ends and they
		// are dropped; the next one streams from the new primary, after
		// comparing what was published with its branch point.
		if r.standby != nil && !r.history.Accepted(ctx) {
			return errHistoryChanged
		}
	}
	for len(rows) > 0 {
		n := min(len(rows), r.cfg.BatchSize)
		if err := r.deliverBatch(ctx, rows[:n]); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

func (r *Relay) deliverBatch(ctx context.Context, rows []core.OutboxRow) error {
	for len(rows) > 0 {
		if _, err := r.maintain(ctx); err != nil {
			return err
		}
		batch := core.Envelopes(rows)
		if h := r.hooks.BeforePublish; h != nil {
			if err := h(batch); err != nil {
				return errCrash
			}
		}
		// A relay that was paused may have lost the lease meanwhile:
		// publishing now could interleave with the new reader's sends.
		if time.Until(r.deadline) < r.cfg.LeaseTTL/10 {
			r.bm.Abandoned()
			r.log.Warn("abandoning batch: the slot lease expires before it could be published", "rows", len(rows))
			return errLeaseLost
		}
		start := time.Now()
		// No marker is in flight here: deliver marks before it goes on.
		err := delivery.PublishUntil(ctx, r.deadline, r.sink, r.fences, rows, batch, nil)
		if ctx.Err() != nil {
			return ctx.Err() // hard stop: nothing is marked or confirmed
		}
		s, _ := delivery.Settle(batch, err)
		r.bm.Published(len(batch), s.Acked, time.Since(start))
		if s.Acked > 0 {
			if h := r.hooks.AfterAck; h != nil {
				if herr := h(batch); herr != nil {
					return errCrash
				}
			}
		}
		if len(s.Mark) > 0 {
			refs := make([]core.RowRef, len(s.Mark))
			for i, j := range s.Mark {
				refs[i] = rows[j].RowRef
			}
			if err := r.mark(ctx, refs); err != nil {
				return err
			}
		}
		for _, p := range s.Parks {
			isNew, perr := r.outbx.Park(ctx, p)
			if perr != nil {
				return perr
			}
			r.parked[p.Key()] = true
			if isNew {
				r.bm.NewlyParked()
			}
			r.log.Error("aggregate parked: the sink rejected its record for good; other aggregates keep flowing; release with `posthorn outbox release`",
				"aggregate_type", p.AggregateType, "aggregate_id", p.AggregateID, "event_id", p.EventID, "reason", p.Reason)
		}
		// A record that keeps failing retryably while the sink takes others
		// parks its aggregate instead of holding the stream for ever.
		stuckNow := map[core.AggregateKey]bool{}
		for _, p := range r.stuck.Observe(batch, err, s) {
			isNew, perr := r.outbx.Park(ctx, p)
			if perr != nil {
				return perr
			}
			k := p.Key()
			r.parked[k], stuckNow[k] = true, true
			if isNew {
				r.bm.NewlyParked()
			}
			r.log.Error("aggregate parked: its record kept failing retryably while the sink took others; other aggregates keep flowing; release with `posthorn outbox release`",
				"aggregate_type", p.AggregateType, "aggregate_id", p.AggregateID, "event_id", p.EventID, "reason", p.Reason)
		}
		if len(stuckNow) > 0 {
			kept := s.Retry[:0:0]
			for _, j := range s.Retry {
				if !stuckNow[batch[j].Aggregate()] {
					kept = append(kept, j)
				}
			}
			if s.Retry = kept; len(kept) == 0 {
				s.Retryable = nil
			}
		}
		if s.Retryable == nil {
			r.retry.Reset()
			return nil
		}
		r.bm.Retried()
		if r.fences != nil {
			// A transaction that failed may have committed: the session
			// starts again and fences first, so what did commit is marked
			// and skipped instead of sent again.
			return fmt.Errorf("exactly-once: %d of %d records not committed; fencing again: %w", len(s.Retry), len(batch), s.Retryable)
		}
		r.log.Warn("sink failed; retrying with backoff", "failed", len(s.Retry), "batch", len(batch), "err", s.Retryable)
		next := make([]core.OutboxRow, len(s.Retry))
		for i, j := range s.Retry {
			next[i] = rows[j]
		}
		rows = next
		r.backoff(ctx)
		if r.stopping() || ctx.Err() != nil {
			return errStopping
		}
	}
	return nil
}

// awaitHistory waits until the ledger runs on the accepted history,
// renewing the slot lease meanwhile.
func (r *Relay) awaitHistory(ctx context.Context) error {
	for !r.history.Accepted(ctx) {
		if _, err := r.maintain(ctx); err != nil {
			return err
		}
		if r.stopping() || ctx.Err() != nil {
			return errStopping
		}
		r.life.Sleep(ctx, historyhold.Poll)
	}
	return nil
}

// awaitStandbys waits until enough standbys have flushed WAL up to commit
// (0: the insert position read first), renewing the slot lease meanwhile;
// the reader keeps answering the server while the relay is held.
func (r *Relay) awaitStandbys(ctx context.Context, commit LSN) error {
	if r.standby == nil {
		return nil
	}
	began := time.Now()
	for {
		if _, err := r.maintain(ctx); err != nil {
			return err
		}
		target, ok, err := r.standby.Wait(ctx, r.life, commit, r.nextMaintain)
		switch {
		case ok && time.Since(began) < standbyQuick:
			return nil
		case ok:
			// Held: the rows may be from a primary that has since failed
			// over (a new standby of the promoted one can pass commit).
			return r.sameTimeline(ctx)
		case err != nil:
			r.log.Error("standby flush", "err", err)
			r.backoff(ctx)
		}
		if err := r.sameTimeline(ctx); err != nil {
			return err
		}
		if r.stopping() || ctx.Err() != nil {
			return errStopping
		}
		commit = target
	}
}

// fence, in exactly-once mode, fences every shard and marks the rows their
// newest committed transactions hold (delivery.Fences), so nothing committed
// is sent again: at the start of each session, which a failed transaction
// or marker ends. It gives up a quarter of the lease before the lease ends,
// so that a fence waiting on a transaction coordinator out of reach leaves
// the next session the time to renew the lease (run).
func (r *Relay) fence(ctx context.Context) error {
	if r.fences == nil {
		return nil
	}
	all := make([]int, core.Shards)
	for i := range all {
		all[i] = i
	}
	r.fences.Need(all...)
	refs, fenced, err := r.fences.Fence(ctx, r.deadline.Add(-r.cfg.LeaseTTL/4))
	if err != nil {
		return fmt.Errorf("fence shards for exactly-once: %w", err)
	}
	// A row cleaned up since is simply not there (reported invisible).
	marked, _, lost, err := r.store.MarkRelayed(ctx, refs, *r.lease)
	switch {
	case err != nil:
		return err
	case lost:
		return errLeaseLost
	}
	r.fences.Done(fenced)
	r.log.Info("shards fenced for exactly-once", "committed_rows", len(refs), "newly_marked", marked)
	return nil
}

// dropFences closes the shards' producers once the slot lease is gone.
func (r *Relay) dropFences() {
	if r.fences == nil {
		return
	}
	for s := range core.Shards {
		r.fences.Drop(s)
	}
}

// mark writes the markers of refs. Rows the marker statement cannot see yet
// (their commit is decoded but not yet visible to other sessions) are
// marked again shortly, until they are: the position is never confirmed
// past an unmarked row.
func (r *Relay) mark(ctx context.Context, refs []core.RowRef) error {
	wait := time.Millisecond
	for len(refs) > 0 {
		_, invisible, fenced, err := r.store.MarkRelayed(ctx, refs, *r.lease)
		if err != nil {
			// The records are out; without a marker nothing is confirmed and
			// they will be sent again with the same event IDs.
			return err
		}
		if fenced {
			r.bm.Fenced(len(refs))
			r.log.Warn("markers refused: the slot lease was taken over; its new reader resends", "refused", len(refs))
			return errLeaseLost
		}
		refs = invisible
		if len(refs) == 0 {
			return nil
		}
		t := time.NewTimer(wait) // the committing session is about to make them visible
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		wait = min(2*wait, 100*time.Millisecond)
		if _, err := r.maintain(ctx); err != nil {
			return err
		}
	}
	return nil
}

// refreshStats updates the backlog, open-transaction, slot and lag gauges,
// waiting relaymetrics.StatsWait between reads (longer while reading is slow).
func (r *Relay) refreshStats(ctx context.Context) {
	t := time.NewTimer(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		began := time.Now()
		if st, err := r.outbx.Status(ctx); err == nil {
			r.bm.SetStatus(st)
		} else if ctx.Err() == nil {
			r.log.Warn("outbox status", "err", err)
		}
		if age, err := r.outbx.OldestOpenTransactionAge(ctx); err == nil {
			r.bm.SetHeldByOpenTransaction(age)
		}
		if st, err := r.store.SlotStatus(ctx, r.cfg.CDC.Slot); err == nil {
			r.m.setSlot(st)
		} else if ctx.Err() == nil {
			r.log.Warn("slot status", "err", err)
		}
		if ns := r.lagNanos.Load(); ns != 0 {
			r.m.lag.Set(time.Since(time.Unix(0, ns)).Seconds())
		} else {
			r.m.lag.Set(0)
		}
		t.Reset(relaymetrics.StatsWait(r.cfg.StatsInterval, time.Since(began)))
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
