package cdc

import (
	"context"
	"errors"
	"time"

	"github.com/posthorn/posthorn/core"
)

// This file is the replication session: the slot, the catch-up read, and
// the stream loop that turns committed transactions into batches.

// session prepares the slot (recovering it when it is missing or lost),
// catches up from the outbox, then streams until an error, a stop or the
// loss of the lease.
func (r *Relay) session(ctx context.Context) error {
	// Make sure the lease is still ours before touching the slot: a relay
	// whose stream just ended may have lost it, and ending the WAL sender of
	// the slot's new reader would make the two take turns for ever.
	r.nextMaintain = time.Time{}
	if _, err := r.maintain(ctx); err != nil {
		return err
	}
	if err := r.store.CheckServer(ctx); err != nil {
		return err
	}
	if err := r.checkBranch(ctx); err != nil {
		return err
	}
	if err := r.store.EnsurePublication(ctx, r.cfg.CDC.Publication); err != nil {
		return err
	}
	if err := r.prepareSlot(ctx); err != nil {
		return err
	}
	if err := r.loadParked(ctx); err != nil {
		return err
	}
	// Before the catch-up reads what is unrelayed, mark what the shards'
	// committed transactions hold (exactly-once): the catch-up and the
	// stream's marker check then skip it.
	if err := r.fence(ctx); err != nil {
		return err
	}
	r.filterUntil = 0
	if !r.hooks.SkipCatchUp {
		if err := r.catchUp(ctx); err != nil {
			return err
		}
	}
	st, err := r.store.OpenStream(ctx, r.cfg.CDC.Slot, r.cfg.CDC.Publication)
	if err != nil {
		if errors.Is(err, ErrSlotInUse) {
			// A stalled previous holder still streams: it lost the lease, end
			// it (after checking that the lease is still this relay's).
			r.nextMaintain = time.Time{}
			if _, lerr := r.maintain(ctx); lerr != nil {
				return lerr
			}
			_ = r.store.TerminateReader(ctx, r.cfg.CDC.Slot)
		}
		return err
	}
	r.stream = st
	r.reader = newStreamReader(ctx, st, 2*r.cfg.BatchSize, r.cfg.CDC.StatusInterval, r.hooks.UnsafeSilentReader)
	r.confirmed = 0
	r.retry.Reset()
	r.log.Info("streaming the outbox from the slot", "publication", r.cfg.CDC.Publication, "wal_sender_pid", st.BackendPID())
	return r.streamLoop(ctx)
}

// prepareSlot makes sure the slot exists and can stream; when it is missing
// or invalidated it says so loudly and creates a new one. The new slot is
// created BEFORE the outbox catch-up: every transaction that committed
// before its consistent point is visible to the catch-up's reads, and every
// later one is in the stream, so nothing falls between the two.
func (r *Relay) prepareSlot(ctx context.Context) error {
	st, err := r.store.SlotStatus(ctx, r.cfg.CDC.Slot)
	if err != nil {
		return err
	}
	r.m.setSlot(st)
	switch {
	case st.Exists && st.WALStatus != "lost":
		if st.Active {
			// (session renewed the lease just before: it is this relay's.)
			// The WAL sender of a previous holder that stalled (it lost the
			// lease, so it cannot mark or confirm; end its stream).
			r.log.Warn("slot still streamed by a previous reader; ending its WAL sender", "pid", st.ActivePID)
			if err := r.store.TerminateReader(ctx, r.cfg.CDC.Slot); err != nil {
				return err
			}
			return r.waitInactive(ctx)
		}
		return nil
	case st.Exists:
		r.m.recoveries.WithLabelValues("lost").Inc()
		r.log.Error("CDC SLOT LOST: the server invalidated the replication slot (wal_status=lost: it removed WAL the slot still needed, because more than max_slot_wal_keep_size was retained); recovering from the retained outbox: unrelayed rows are sent from the outbox, then streaming resumes from a new slot",
			"max_slot_wal_keep_size", st.MaxSlotWALKeepSize, "confirmed_flush_lsn", st.ConfirmedFlushLSN)
		if err := r.store.DropSlot(ctx, r.cfg.CDC.Slot); err != nil {
			return err
		}
	case !r.lease.SlotCreatedAt.IsZero():
		r.m.recoveries.WithLabelValues("missing").Inc()
		r.log.Error("CDC SLOT LOST: the replication slot is missing (dropped by someone, or the server was restored/failed over without it); recovering from the retained outbox: unrelayed rows are sent from the outbox, then streaming resumes from a new slot",
			"slot_created_at", r.lease.SlotCreatedAt)
	default:
		r.log.Info("creating the replication slot (first start in CDC mode); the outbox backlog is sent first")
	}
	if h := r.hooks.BeforeSlotCreate; h != nil {
		h()
	}
	lsn, err := r.store.CreateSlot(ctx, r.cfg.CDC.Slot)
	if err != nil {
		return err
	}
	r.lease.SlotCreatedAt = time.Now()
	r.log.Warn("replication slot created", "consistent_point", lsn.String())
	if st, err := r.store.SlotStatus(ctx, r.cfg.CDC.Slot); err == nil {
		r.m.setSlot(st)
	}
	return nil
}

func (r *Relay) waitInactive(ctx context.Context) error {
	deadline := time.Now().Add(r.cfg.LeaseTTL)
	for time.Now().Before(deadline) {
		st, err := r.store.SlotStatus(ctx, r.cfg.CDC.Slot)
		if err != nil {
			return err
		}
		if !st.Active {
			return nil
		}
		r.life.Sleep(ctx, 50*time.Millisecond)
		if r.stopping() || ctx.Err() != nil {
			return errStopping
		}
		if _, err := r.maintain(ctx); err != nil {
			return err
		}
	}
	return errors.New("the previous reader's WAL sender did not end")
}

// catchUp sends the unrelayed outbox rows (parked aggregates excepted) in
// id order, through the polling relay's read path, up to the largest id
// visible now: every row committed before the slot's consistent point is
// below that bound, and every row above it committed later and is in the
// stream. The bound makes the catch-up finish under any write load. Rows the
// stream later repeats are skipped when already marked.
func (r *Relay) catchUp(ctx context.Context) error {
	bound, err := r.store.OutboxMaxID(ctx)
	if err != nil {
		return err
	}
	perShard := (r.cfg.BatchSize + core.Shards - 1) / core.Shards
	shards := make([]int, core.Shards)
	for i := range shards {
		shards[i] = i
	}
	total := 0
	for len(shards) > 0 {
		if _, err := r.maintain(ctx); err != nil {
			return err
		}
		rows, err := r.outbx.ReadBatchSkipping(ctx, shards, perShard, nil, core.OrderByID)
		if err != nil {
			r.bm.ReadFailed(err)
			return err
		}
		// Per shard, rows come in id order: a shard is done when its read was
		// not full (nothing more unrelayed) or reached past the bound.
		count, last := map[int]int{}, map[int]int64{}
		for _, row := range rows {
			count[row.Shard]++
			last[row.Shard] = max(last[row.Shard], row.ID)
		}
		if err := r.deliver(ctx, rows, 0); err != nil {
			return err
		}
		total += len(rows)
		r.m.caughtUp.Add(float64(len(rows)))
		more := shards[:0]
		for _, s := range shards {
			if count[s] >= perShard && last[s] <= bound {
				more = append(more, s)
			}
		}
		shards = more
	}
	lsn, err := r.store.CurrentWALLSN(ctx)
	if err != nil {
		return err
	}
	r.filterUntil = lsn
	if total > 0 {
		r.log.Info("caught up from the outbox", "events", total, "up_to_id", bound, "skip_marked_until", lsn.String())
	}
	return nil
}

// txn is a committed transaction received from the stream: the server
// sends a transaction only once it has committed (pgoutput without
// streaming), so its rows may be delivered before its end arrives, as long
// as the position is confirmed only past its end.
type txn struct {
	rows []core.OutboxRow
	// final is the LSN of its commit record (from its begin message), end
	// the position after it (from its commit message).
	final, end LSN
	commitTime time.Time
	// delivered counts the rows delivered before its end arrived.
	delivered int
	// relayed: the transaction inserted rows as relayed
	// (EventRelayedRows); each of its rows is checked for its marker.
	relayed bool
}

func (r *Relay) heartbeatOn() bool { return !r.hooks.UnsafeNoHeartbeat }

func (r *Relay) streamLoop(ctx context.Context) error {
	var (
		open         *txn
		pending      []txn
		pendingRows  int
		firstPending time.Time
		lastActivity = time.Now()
	)
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		err := r.flush(ctx, pending)
		pending, pendingRows = nil, 0
		return err
	}
	for {
		if r.stopping() || ctx.Err() != nil {
			// Soft stop: the received, committed transactions are delivered
			// and confirmed; an open one is resent after the restart (what of
			// it was delivered already is marked, and skipped then).
			if err := flush(); err != nil {
				return err
			}
			return errStopping
		}
		released, err := r.maintain(ctx)
		if err != nil {
			return err
		}
		if released {
			// A released aggregate's held rows were passed by the stream:
			// send them from the outbox (with everything else unrelayed).
			if err := flush(); err != nil {
				return err
			}
			if err := r.catchUp(ctx); err != nil {
				return err
			}
		}
		now := time.Now()
		deadline := r.nextMaintain
		if r.heartbeatOn() && open == nil && len(pending) == 0 {
			deadline = earliest(deadline, lastActivity.Add(r.cfg.CDC.HeartbeatInterval))
		}
		if len(pending) > 0 {
			deadline = earliest(deadline, firstPending.Add(r.cfg.CDC.BatchLinger))
		}
		if deadline.Before(now) {
			deadline = now
		}
		ev, err := r.reader.next(ctx, deadline)
		if err != nil {
			if ctx.Err() != nil || r.stopping() {
				return errStopping
			}
			return err
		}
		switch ev.Kind {
		case EventBegin:
			open = &txn{final: ev.LSN, commitTime: ev.CommitTime}
			lastActivity = time.Now()
		case EventRow:
			if open == nil {
				return errors.New("replication stream: row outside a transaction")
			}
			open.rows = append(open.rows, ev.Row)
			if pendingRows+len(open.rows) >= r.cfg.BatchSize {
				// A large transaction: deliver what has arrived of it while the
				// reader decodes the rest, instead of holding it all first.
				if err := flush(); err != nil {
					return err
				}
				if len(open.rows) >= r.cfg.BatchSize {
					if err := r.deliverReceived(ctx, []txn{*open}); err != nil {
						return err
					}
					open.delivered += len(open.rows)
					open.rows = nil
				}
			}
		case EventCommit:
			if open == nil {
				return errors.New("replication stream: commit outside a transaction")
			}
			open.end = ev.LSN
			if len(open.rows) > 0 || open.delivered > 0 {
				if len(pending) == 0 {
					firstPending = time.Now()
					r.lagNanos.Store(open.commitTime.UnixNano())
				}
				if r.hooks.UnsafeConfirmOnReceipt {
					r.advance(open.end)
				}
				pending = append(pending, *open)
				pendingRows += len(open.rows)
			} else if len(pending) == 0 && r.heartbeatOn() {
				r.advance(open.end)
			}
			open = nil
		case EventRelayedRows:
			if open == nil {
				return errors.New("replication stream: relayed rows outside a transaction")
			}
			open.relayed = true
		case EventHeartbeat:
			if open == nil && len(pending) == 0 && r.heartbeatOn() {
				r.advance(ev.LSN)
			}
		case EventKeepalive:
			// The server has sent every transaction that committed before
			// ev.LSN; with nothing in flight, all of them are handled. (The
			// reader answers a keepalive that asks for a reply.)
			if open == nil && len(pending) == 0 && r.heartbeatOn() {
				r.advance(ev.LSN)
			}
		}
		now = time.Now()
		if pendingRows >= r.cfg.BatchSize || (len(pending) > 0 && !now.Before(firstPending.Add(r.cfg.CDC.BatchLinger))) {
			if err := flush(); err != nil {
				return err
			}
			lastActivity = time.Now()
		}
		if r.heartbeatOn() && open == nil && len(pending) == 0 && !now.Before(lastActivity.Add(r.cfg.CDC.HeartbeatInterval)) {
			// Something to confirm past WAL that other databases or tables
			// wrote while the outbox was quiet.
			if _, err := r.store.EmitHeartbeat(ctx); err != nil {
				r.log.Warn("emit heartbeat", "err", err)
			} else {
				r.m.heartbeats.Inc()
			}
			lastActivity = time.Now()
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// flush delivers the rows of the received transactions in commit order,
// then confirms the last one's end: the confirmed position never passes a
// row that is not ACKed and marked (or parked).
func (r *Relay) flush(ctx context.Context, pending []txn) error {
	if err := r.deliverReceived(ctx, pending); err != nil {
		return err
	}
	r.lagNanos.Store(0)
	r.m.lag.Set(0)
	r.advance(pending[len(pending)-1].end)
	return nil
}

// deliverReceived delivers the received rows of txns, in order, but those
// of parked aggregates and those already marked: the catch-up's, where a
// transaction committed before the catch-up ended, and the rows a
// transaction inserted as relayed (a failover recovery's re-committed
// events, which the world has: sent again they would only be repeats).
func (r *Relay) deliverReceived(ctx context.Context, txns []txn) error {
	var rows []core.OutboxRow
	var check []int64
	ends := map[int64]LSN{}
	for _, t := range txns {
		for _, row := range t.rows {
			if r.parked[row.Envelope.Aggregate()] {
				continue // held behind its parked record; sent on release
			}
			rows = append(rows, row)
			ends[row.ID] = t.end
			// final is before end: this checks at least every row whose
			// transaction ended by filterUntil.
			if t.final <= r.filterUntil || t.relayed {
				check = append(check, row.ID)
			}
		}
	}
	if len(check) > 0 {
		marked, err := r.store.Marked(ctx, check)
		if err != nil {
			return err
		}
		if len(marked) > 0 {
			kept := rows[:0]
			for _, row := range rows {
				if !marked[row.ID] {
					kept = append(kept, row)
				}
			}
			r.m.skippedMarks.Add(float64(len(rows) - len(kept)))
			rows = kept
		}
	}
	// The standbys must hold the commit of the last transaction (an open
	// one's end is not known yet: then whatever is inserted now, which is
	// past its commit, since the server sends only committed transactions).
	commit := txns[len(txns)-1].end
	if err := r.deliver(ctx, rows, commit); err != nil {
		return err
	}
	r.published.add(rows, ends)
	if h := r.hooks.AfterMark; h != nil && len(rows) > 0 {
		if err := h(core.Envelopes(rows)); err != nil {
			return errCrash
		}
	}
	return nil
}

// advance confirms lsn to the server (through the reader) if it moves the
// position forward.
func (r *Relay) advance(lsn LSN) {
	if lsn <= r.confirmed {
		return
	}
	r.confirmed = lsn
	r.reader.confirm(lsn)
}
