package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/posthorn/posthorn/bridge"
	"github.com/posthorn/posthorn/core"
)

var (
	// ErrAlreadyStarted is returned by a second Start (the lifecycle is
	// the polling relay's).
	ErrAlreadyStarted = bridge.ErrAlreadyStarted
	errCrash          = errors.New("CDC relay crashed (test hook)")
	errLeaseLost      = errors.New("slot lease lost")
	errStopping       = errors.New("stopping")
)

// Relay streams the outbox from a replication slot to a sink. See the
// package documentation for its invariants.
type Relay struct {
	cfg   Config
	store Source
	outbx OutboxStore
	sink  core.Sink
	bm    *bridge.Metrics
	m     *metrics
	log   *slog.Logger

	life     *bridge.Lifecycle
	readyErr atomic.Pointer[error]
	crashed  atomic.Bool
	lagNanos atomic.Int64 // commit time (unix ns) of the oldest unconfirmed transaction; 0 none

	// Owned by the loop goroutine.
	lease        *Lease
	deadline     time.Time // lease expiry as this relay knows it
	nextMaintain time.Time
	retry        *backoff.ExponentialBackOff
	stuck        *bridge.StuckTracker
	parked       map[core.AggregateKey]bool
	filterUntil  LSN // streamed rows committed up to here may already be marked
	stream       Stream
	confirmed    LSN
	lastStatus   time.Time
}

// New returns a CDC relay that streams the outbox from source, reads and
// parks through outbox, and publishes to sink. It does not start it and
// does not contact the server; Check does.
func New(outbox OutboxStore, source Source, sink core.Sink, cfg Config) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bm, err := bridge.NewMetrics(cfg.Registerer, cfg.SinkName)
	if err != nil {
		return nil, fmt.Errorf("relay metrics: %w", err)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Slot)
	if err != nil {
		return nil, fmt.Errorf("CDC metrics: %w", err)
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = cfg.RetryInitial
	bo.MaxInterval = cfg.RetryMax
	bo.RandomizationFactor = 0.5
	r := &Relay{
		cfg:   cfg,
		store: source,
		outbx: outbox,
		sink:  sink,
		bm:    bm,
		m:     m,
		log:   cfg.Logger.With("component", "relay", "mode", "cdc", "owner", cfg.Owner, "slot", cfg.Slot),
		life:  bridge.NewLifecycle(),
		retry: bo,
		stuck: bridge.NewStuckTracker(cfg.ParkAfterAttempts, cfg.ParkAfter),
	}
	notReady := errors.New("relay not started")
	r.readyErr.Store(&notReady)
	return r, nil
}

// Check reports, wrapped in ErrNotAvailable, why the server
// cannot serve this relay (wal_level not logical, role without
// REPLICATION). `posthorn relay` calls it before Start.
func (r *Relay) Check(ctx context.Context) error { return r.store.CheckServer(ctx) }

// Start runs the relay in the background and returns at once. Cancelling
// ctx stops it softly, like Stop.
func (r *Relay) Start(ctx context.Context) error {
	return r.life.Start(ctx, r.run, r.refreshStats)
}

// Stop stops the relay softly: the batch in flight is published, marked
// and confirmed (or, if that cannot finish, left to be sent again), the
// stream is closed and the lease released so a standby takes over at
// once. If ctx ends first the batch is cut short and Stop returns ctx's
// error once the loop has exited.
func (r *Relay) Stop(ctx context.Context) error { return r.life.Stop(ctx) }

// Stopped is closed when the relay has stopped.
func (r *Relay) Stopped() <-chan struct{} { return r.life.Stopped() }

// Crashed reports whether a test hook crashed the relay.
func (r *Relay) Crashed() bool { return r.crashed.Load() }

// Ready reports whether the relay runs and its last lease round trip
// succeeded (for /readyz); a standby is ready.
func (r *Relay) Ready() error {
	select {
	case <-r.life.Stopped():
		return errors.New("relay stopped")
	default:
	}
	return *r.readyErr.Load()
}

// Owner is the name this relay holds the lease under.
func (r *Relay) Owner() string { return r.cfg.Owner }

func (r *Relay) stopping() bool {
	select {
	case <-r.life.SoftStop():
		return true
	default:
		return false
	}
}

func (r *Relay) setReady(err error) { r.readyErr.Store(&err) }

// run acquires the slot's lease, streams while holding it, and stands by
// otherwise.
func (r *Relay) run(ctx context.Context) {
	for !r.stopping() && ctx.Err() == nil {
		if r.lease == nil {
			if !r.acquire(ctx) {
				r.wait(ctx, r.cfg.LeaseTTL/4)
				continue
			}
		}
		err := r.session(ctx)
		r.closeStream(ctx)
		r.m.lag.Set(0)
		r.lagNanos.Store(0)
		switch {
		case errors.Is(err, errCrash):
			r.crashed.Store(true)
			r.log.Warn("CDC relay crashed by test hook: nothing marked or confirmed after the ACK, lease kept")
			return
		case errors.Is(err, errLeaseLost):
			r.log.Warn("slot lease lost; standing by")
			r.lease = nil
			r.m.reader.Set(0)
		case err == nil, errors.Is(err, errStopping), ctx.Err() != nil:
		default:
			r.log.Error("CDC stream ended; restarting from the confirmed position", "err", err)
			r.setReady(err)
			r.backoff(ctx)
		}
	}
	if r.lease != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := r.store.ReleaseLease(rctx, *r.lease, r.cfg.Owner); err != nil {
			r.log.Warn("release slot lease on stop", "err", err)
		}
	}
	r.m.reader.Set(0)
	r.log.Info("CDC relay stopped")
}

func (r *Relay) acquire(ctx context.Context) bool {
	sent := time.Now()
	l, ok, err := r.store.AcquireLease(ctx, r.cfg.Slot, r.cfg.Owner, r.cfg.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error("acquire slot lease", "err", err)
			r.setReady(err)
		}
		return false
	}
	r.setReady(nil)
	if !ok {
		return false
	}
	if l.PreviousOwner != "" {
		r.bm.TookOver()
		r.log.Warn("slot lease taken over from a relay that stopped renewing", "previous_owner", l.PreviousOwner)
	}
	r.lease = &l
	r.deadline = sent.Add(r.cfg.LeaseTTL)
	r.nextMaintain = sent.Add(r.cfg.LeaseTTL / 4)
	r.m.reader.Set(1)
	r.log.Info("holding the slot lease: this relay reads the slot", "token", l.Token)
	return true
}

// maintain renews the lease when due and reloads the parked aggregates;
// it reports errLeaseLost, and whether an aggregate was released.
func (r *Relay) maintain(ctx context.Context) (released bool, err error) {
	if time.Now().Before(r.nextMaintain) {
		return false, nil
	}
	sent := time.Now()
	ok, err := r.store.RenewLease(ctx, *r.lease, r.cfg.Owner, r.cfg.LeaseTTL)
	if err != nil {
		r.setReady(err)
		if time.Now().After(r.deadline) {
			return false, errLeaseLost
		}
		r.nextMaintain = sent.Add(min(r.cfg.LeaseTTL/10, time.Second))
		return false, nil
	}
	if !ok {
		return false, errLeaseLost
	}
	r.setReady(nil)
	r.deadline = sent.Add(r.cfg.LeaseTTL)
	r.nextMaintain = sent.Add(r.cfg.LeaseTTL / 4)
	before := r.parked
	if err := r.loadParked(ctx); err != nil {
		return false, err
	}
	for k := range before {
		if !r.parked[k] {
			return true, nil
		}
	}
	return false, nil
}

func (r *Relay) loadParked(ctx context.Context) error {
	ps, err := r.outbx.Parked(ctx)
	if err != nil {
		return err
	}
	r.parked = make(map[core.AggregateKey]bool, len(ps))
	for _, p := range ps {
		r.parked[p.Key()] = true
	}
	return nil
}

// wait sleeps d unless a stop comes first.
func (r *Relay) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.life.SoftStop():
	case <-ctx.Done():
	}
}

func (r *Relay) backoff(ctx context.Context) { r.wait(ctx, r.retry.NextBackOff()) }

func (r *Relay) closeStream(ctx context.Context) {
	if r.stream == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = r.stream.Close(cctx)
	r.stream = nil
}

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
	if err := r.store.EnsurePublication(ctx, r.cfg.Publication); err != nil {
		return err
	}
	if err := r.prepareSlot(ctx); err != nil {
		return err
	}
	if err := r.loadParked(ctx); err != nil {
		return err
	}
	r.filterUntil = 0
	if r.cfg.Hooks == nil || !r.cfg.Hooks.SkipCatchUp {
		if err := r.catchUp(ctx); err != nil {
			return err
		}
	}
	st, err := r.store.OpenStream(ctx, r.cfg.Slot, r.cfg.Publication)
	if err != nil {
		if errors.Is(err, ErrSlotInUse) {
			// A stalled previous holder still streams: it lost the lease, end
			// it (after checking that the lease is still this relay's).
			r.nextMaintain = time.Time{}
			if _, lerr := r.maintain(ctx); lerr != nil {
				return lerr
			}
			_ = r.store.TerminateReader(ctx, r.cfg.Slot)
		}
		return err
	}
	r.stream = st
	r.confirmed = 0
	r.lastStatus = time.Now()
	r.retry.Reset()
	r.log.Info("streaming the outbox from the slot", "publication", r.cfg.Publication, "wal_sender_pid", st.BackendPID())
	return r.streamLoop(ctx)
}

// prepareSlot makes sure the slot exists and can stream; when it is missing
// or invalidated it says so loudly and creates a new one. The new slot is
// created BEFORE the outbox catch-up: every transaction that committed
// before its consistent point is visible to the catch-up's reads, and every
// later one is in the stream, so nothing falls between the two.
func (r *Relay) prepareSlot(ctx context.Context) error {
	st, err := r.store.SlotStatus(ctx, r.cfg.Slot)
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
			if err := r.store.TerminateReader(ctx, r.cfg.Slot); err != nil {
				return err
			}
			return r.waitInactive(ctx)
		}
		return nil
	case st.Exists:
		r.m.recoveries.WithLabelValues("lost").Inc()
		r.log.Error("CDC SLOT LOST: the server invalidated the replication slot (wal_status=lost: it removed WAL the slot still needed, because more than max_slot_wal_keep_size was retained); recovering from the retained outbox: unrelayed rows are sent from the outbox, then streaming resumes from a new slot",
			"max_slot_wal_keep_size", st.MaxSlotWALKeepSize, "confirmed_flush_lsn", st.ConfirmedFlushLSN)
		if err := r.store.DropSlot(ctx, r.cfg.Slot); err != nil {
			return err
		}
	case !r.lease.SlotCreatedAt.IsZero():
		r.m.recoveries.WithLabelValues("missing").Inc()
		r.log.Error("CDC SLOT LOST: the replication slot is missing (dropped by someone, or the server was restored/failed over without it); recovering from the retained outbox: unrelayed rows are sent from the outbox, then streaming resumes from a new slot",
			"slot_created_at", r.lease.SlotCreatedAt)
	default:
		r.log.Info("creating the replication slot (first start in CDC mode); the outbox backlog is sent first")
	}
	if h := r.cfg.Hooks; h != nil && h.BeforeSlotCreate != nil {
		h.BeforeSlotCreate()
	}
	lsn, err := r.store.CreateSlot(ctx, r.cfg.Slot)
	if err != nil {
		return err
	}
	r.lease.SlotCreatedAt = time.Now()
	r.log.Warn("replication slot created", "consistent_point", lsn.String())
	if st, err := r.store.SlotStatus(ctx, r.cfg.Slot); err == nil {
		r.m.setSlot(st)
	}
	return nil
}

func (r *Relay) waitInactive(ctx context.Context) error {
	deadline := time.Now().Add(r.cfg.LeaseTTL)
	for time.Now().Before(deadline) {
		st, err := r.store.SlotStatus(ctx, r.cfg.Slot)
		if err != nil {
			return err
		}
		if !st.Active {
			return nil
		}
		r.wait(ctx, 50*time.Millisecond)
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
			return err
		}
		// Per shard, rows come in id order: a shard is done when its read was
		// not full (nothing more unrelayed) or reached past the bound.
		count, last := map[int]int{}, map[int]int64{}
		for _, row := range rows {
			count[row.Shard]++
			last[row.Shard] = max(last[row.Shard], row.ID)
		}
		if err := r.deliver(ctx, rows); err != nil {
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

// txn is a committed transaction received from the stream.
type txn struct {
	rows       []core.OutboxRow
	end        LSN
	commitTime time.Time
}

func (r *Relay) heartbeatOn() bool { return r.cfg.HeartbeatInterval > 0 }

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
			// and confirmed; an open one is resent after the restart.
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
		deadline := earliest(r.nextMaintain, r.lastStatus.Add(r.cfg.StatusInterval))
		if r.heartbeatOn() && open == nil && len(pending) == 0 {
			deadline = earliest(deadline, lastActivity.Add(r.cfg.HeartbeatInterval))
		}
		if len(pending) > 0 {
			deadline = earliest(deadline, firstPending.Add(r.cfg.BatchLinger))
		}
		if deadline.Before(now) {
			deadline = now
		}
		ev, err := r.stream.Next(ctx, deadline)
		if err != nil {
			if ctx.Err() != nil || r.stopping() {
				return errStopping
			}
			return err
		}
		switch ev.Kind {
		case EventBegin:
			open = &txn{commitTime: ev.CommitTime}
			lastActivity = time.Now()
		case EventRow:
			if open == nil {
				return errors.New("replication stream: row outside a transaction")
			}
			open.rows = append(open.rows, ev.Row)
		case EventCommit:
			if open == nil {
				return errors.New("replication stream: commit outside a transaction")
			}
			open.end = ev.LSN
			if len(open.rows) > 0 {
				if len(pending) == 0 {
					firstPending = time.Now()
					r.lagNanos.Store(open.commitTime.UnixNano())
				}
				if h := r.cfg.Hooks; h != nil && h.UnsafeConfirmOnReceipt {
					if err := r.advance(ctx, open.end); err != nil {
						return err
					}
				}
				pending = append(pending, *open)
				pendingRows += len(open.rows)
			} else if len(pending) == 0 && r.heartbeatOn() {
				if err := r.advance(ctx, open.end); err != nil {
					return err
				}
			}
			open = nil
		case EventHeartbeat:
			if open == nil && len(pending) == 0 && r.heartbeatOn() {
				if err := r.advance(ctx, ev.LSN); err != nil {
					return err
				}
			}
		case EventKeepalive:
			// The server has sent every transaction that committed before
			// ev.LSN; with nothing in flight, all of them are handled.
			if open == nil && len(pending) == 0 && r.heartbeatOn() && ev.LSN > r.confirmed {
				if err := r.advance(ctx, ev.LSN); err != nil {
					return err
				}
			} else if ev.ReplyRequested {
				if err := r.sendStatus(ctx); err != nil {
					return err
				}
			}
		}
		now = time.Now()
		if pendingRows >= r.cfg.BatchSize || (len(pending) > 0 && !now.Before(firstPending.Add(r.cfg.BatchLinger))) {
			if err := flush(); err != nil {
				return err
			}
			lastActivity = time.Now()
		}
		if !now.Before(r.lastStatus.Add(r.cfg.StatusInterval)) {
			if err := r.sendStatus(ctx); err != nil {
				return err
			}
		}
		if r.heartbeatOn() && open == nil && len(pending) == 0 && !now.Before(lastActivity.Add(r.cfg.HeartbeatInterval)) {
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
	var rows []core.OutboxRow
	var check []int64
	for _, t := range pending {
		for _, row := range t.rows {
			if r.parked[row.Envelope.Aggregate()] {
				continue // held behind its parked record; sent on release
			}
			rows = append(rows, row)
			if t.end <= r.filterUntil {
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
	if err := r.deliver(ctx, rows); err != nil {
		return err
	}
	if h := r.cfg.Hooks; h != nil && h.AfterMark != nil && len(rows) > 0 {
		batch := make([]core.Envelope, len(rows))
		for i, row := range rows {
			batch[i] = row.Envelope
		}
		if err := h.AfterMark(batch); err != nil {
			return errCrash
		}
	}
	r.lagNanos.Store(0)
	r.m.lag.Set(0)
	return r.advance(ctx, pending[len(pending)-1].end)
}

// advance confirms lsn to the server if it moves the position forward.
func (r *Relay) advance(ctx context.Context, lsn LSN) error {
	if lsn <= r.confirmed {
		return nil
	}
	r.confirmed = lsn
	return r.sendStatus(ctx)
}

func (r *Relay) sendStatus(ctx context.Context) error {
	r.lastStatus = time.Now()
	if r.confirmed == 0 {
		// Nothing confirmed in this session yet: the server keeps the slot's
		// own position (a zero would be ignored, but say nothing instead).
		return nil
	}
	return r.stream.Confirm(ctx, r.confirmed)
}

// deliver publishes rows in order in batches of BatchSize, marks what was
// ACKed (fenced by the slot lease), parks what the sink rejected for good
// and retries the rest with backoff until it is ACKed. It returns only
// when every row is marked or parked, or with the reason it could not.
func (r *Relay) deliver(ctx context.Context, rows []core.OutboxRow) error {
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
		batch := make([]core.Envelope, len(rows))
		for i, row := range rows {
			batch[i] = row.Envelope
		}
		if h := r.cfg.Hooks; h != nil && h.BeforePublish != nil {
			if err := h.BeforePublish(batch); err != nil {
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
		pubCtx, cancel := context.WithDeadline(ctx, r.deadline)
		start := time.Now()
		err := bridge.PublishBatch(pubCtx, r.sink, batch)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err() // hard stop: nothing is marked or confirmed
		}
		s := bridge.Settle(batch, err)
		r.bm.Published(len(batch), s.Acked, time.Since(start))
		if s.Acked > 0 {
			if h := r.cfg.Hooks; h != nil && h.AfterAck != nil {
				if herr := h.AfterAck(batch); herr != nil {
					return errCrash
				}
			}
		}
		if len(s.Mark) > 0 {
			ids := make([]int64, len(s.Mark))
			for i, j := range s.Mark {
				ids[i] = rows[j].ID
			}
			if err := r.mark(ctx, ids); err != nil {
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
			if r.stream != nil && time.Since(r.lastStatus) >= r.cfg.StatusInterval {
				// A long delivery (a huge transaction) must not let the WAL
				// sender time out waiting for a reply.
				return r.sendStatus(ctx)
			}
			return nil
		}
		r.bm.Retried()
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
		if r.stream != nil {
			// Keep the WAL sender from timing out while the sink is down.
			if err := r.sendStatus(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// mark writes the markers of ids. Rows the marker statement cannot see yet
// (their commit is decoded but not yet visible to other sessions) are
// marked again shortly, until they are: the position is never confirmed
// past an unmarked row.
func (r *Relay) mark(ctx context.Context, ids []int64) error {
	wait := time.Millisecond
	for len(ids) > 0 {
		_, invisible, fenced, err := r.store.MarkRelayed(ctx, ids, *r.lease)
		if err != nil {
			// The records are out; without a marker nothing is confirmed and
			// they will be sent again with the same event IDs.
			return err
		}
		if fenced {
			r.bm.Fenced(len(ids))
			r.log.Warn("markers refused: the slot lease was taken over; its new reader resends", "refused", len(ids))
			return errLeaseLost
		}
		ids = invisible
		if len(ids) == 0 {
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

// refreshStats updates the backlog, open-transaction, slot and lag gauges.
func (r *Relay) refreshStats(ctx context.Context) {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		if st, err := r.outbx.Status(ctx); err == nil {
			r.bm.SetStatus(st)
		} else if ctx.Err() == nil {
			r.log.Warn("outbox status", "err", err)
		}
		if age, err := r.outbx.OldestOpenTransactionAge(ctx); err == nil {
			r.bm.SetHeldByOpenTransaction(age)
		}
		if st, err := r.store.SlotStatus(ctx, r.cfg.Slot); err == nil {
			r.m.setSlot(st)
		} else if ctx.Err() == nil {
			r.log.Warn("slot status", "err", err)
		}
		if ns := r.lagNanos.Load(); ns != 0 {
			r.m.lag.Set(time.Since(time.Unix(0, ns)).Seconds())
		} else {
			r.m.lag.Set(0)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
