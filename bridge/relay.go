package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/posthorn/posthorn/core"
)

// ErrAlreadyStarted is returned by a second Start.
var ErrAlreadyStarted = errors.New("relay already started")

// errCrash ends the loop without markers or lease release (Hooks.AfterAck).
var errCrash = errors.New("relay crashed (test hook)")

// Relay moves outbox rows of its leased shards to the sink. See the package
// documentation for its invariants.
type Relay struct {
	cfg   Config
	store Store
	sink  core.Sink
	// fences is set in exactly-once mode (exactly_once.go).
	fences *Fences
	m      *metrics
	log    *slog.Logger

	life    *Lifecycle
	wake    chan struct{}
	crashed atomic.Bool

	// Owned by the loop goroutine.
	leases       []core.Lease
	deadline     time.Time
	nextMaintain time.Time
	retry        *backoff.ExponentialBackOff
	stuck        *StuckTracker
}

// New returns a relay over store that publishes to sink. It does not start
// it; cfg's zero fields take their defaults and the rest are validated.
func New(store Store, sink core.Sink, cfg Config) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.SinkName)
	if err != nil {
		return nil, fmt.Errorf("relay metrics: %w", err)
	}
	r := &Relay{
		cfg:   cfg,
		store: store,
		sink:  sink,
		m:     m,
		log:   cfg.Logger.With("component", "relay", "owner", cfg.Owner),
		life:  NewLifecycle(),
		wake:  make(chan struct{}, 1),
		retry: NewRetry(cfg.RetryInitial, cfg.RetryMax),
		stuck: NewStuckTracker(cfg.ParkAfterAttempts, cfg.ParkAfter),
	}
	if cfg.ExactlyOnce {
		if r.fences, err = NewFences(sink, cfg.Hooks != nil && cfg.Hooks.UnsafeSkipPositions); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Start runs the relay in the background and returns at once. Cancelling
// ctx stops the relay softly, like Stop.
func (r *Relay) Start(ctx context.Context) error {
	return r.life.Start(ctx, r.run, r.listen, r.refreshStats)
}

// Stop stops the relay softly: the in-flight batch is finished or
// abandoned, ACKed records get their markers, leases are released. If ctx
// ends first, the batch is cut short (its records will be sent again) and
// Stop returns ctx's error once the loop has exited. Stop on a relay that
// was never started returns nil.
func (r *Relay) Stop(ctx context.Context) error { return r.life.Stop(ctx) }

// Stopped is closed when the relay has stopped.
func (r *Relay) Stopped() <-chan struct{} { return r.life.Stopped() }

// Ready reports whether the relay is running and its last lease round trip
// succeeded (for /readyz).
func (r *Relay) Ready() error { return r.life.Ready() }

// Owner is the name this relay holds leases under.
func (r *Relay) Owner() string { return r.cfg.Owner }

// Shards returns the shards this relay held at its last lease round trip.
// It is only safe to call after Stopped is closed (tests).
func (r *Relay) Shards() []int { return leaseShards(r.leases) }

func leaseShards(ls []core.Lease) []int {
	out := make([]int, len(ls))
	for i, l := range ls {
		out[i] = l.Shard
	}
	return out
}

func (r *Relay) stopping() bool { return r.life.Stopping() }

func (r *Relay) run(ctx context.Context) {
	poll := r.cfg.MinPollInterval
	order := core.OrderByID
	if r.cfg.Hooks != nil && r.cfg.Hooks.UnsafeOrderByXID {
		order = core.OrderByXIDUnsafe
	}
	// At most one marker is written in the background while the next batch
	// is read and published (see markJob); inflight is that marker.
	var inflight *markJob
	var cursor int64 // only with Hooks.UnsafeCursor
	settle := func() {
		r.awaitMark(inflight)
		inflight = nil
	}
	defer settle()
	// While a batch is published, the next one is read (see readAhead);
	// next is that read.
	var next *readAhead
	drop := func() {
		next.wait()
		next = nil
	}
	defer drop()
	for !r.stopping() && ctx.Err() == nil {
		if !time.Now().Before(r.nextMaintain) {
			drop() // read under the leases that are about to change
			settle()
			r.maintainLeases(ctx)
		}
		if len(r.leases) == 0 {
			settle()
			r.wait(ctx, r.cfg.PollInterval)
			continue
		}
		if r.fences != nil && r.fences.Pending() {
			drop()
			settle()
			if err := r.fence(ctx); err != nil {
				if !errors.Is(err, errLeaseDue) {
					// Short enough that the leases are renewed meanwhile.
					r.backoffFor(ctx, min(r.retry.NextBackOff(), r.cfg.LeaseTTL/4))
				}
				continue
			}
		}
		shards := leaseShards(r.leases)
		perShard := (r.cfg.BatchSize + len(r.leases) - 1) / len(r.leases)
		if next == nil {
			next = r.readAhead(ctx, shards, perShard, inflight.rowIDs(), order)
		}
		rows, err := next.wait()
		next = nil
		if err != nil {
			settle()
			if ctx.Err() != nil {
				break
			}
			r.log.Error("read outbox", "err", err)
			r.backoff(ctx)
			continue
		}
		if r.cfg.Hooks != nil && r.cfg.Hooks.UnsafeCursor {
			rows = afterCursor(rows, &cursor)
		}
		if len(rows) == 0 {
			if inflight != nil {
				settle() // its rows may be all there is: look again once marked
				continue
			}
			r.wait(ctx, poll)
			poll = min(2*poll, r.cfg.PollInterval)
			continue
		}
		poll = r.cfg.MinPollInterval
		skip := inflight.rowIDs()
		for _, row := range rows {
			skip = append(skip, row.ID)
		}
		next = r.readAhead(ctx, shards, perShard, skip, order)
		job, err := r.relayBatch(ctx, rows, inflight.rowRefs())
		if errors.Is(err, errCrash) {
			drop()
			settle()
			r.crashed.Store(true)
			r.log.Warn("relay crashed by test hook: no marker written, leases kept")
			return
		}
		settle()
		if job == nil {
			drop() // not all of this batch was ACKed: the next may not follow it
			continue
		}
		inflight = r.startMark(ctx, job)
	}
	drop()
	settle()
	// Soft stop (or hard cancel): give the leases back so another relay
	// takes over at once instead of after the TTL.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.store.ReleaseLeases(rctx, r.cfg.Owner, r.leases); err != nil {
		r.log.Warn("release leases on stop", "err", err)
	}
	if r.fences != nil {
		for _, l := range r.leases {
			r.fences.Drop(l.Shard)
		}
	}
	if err := r.store.Leave(rctx, r.cfg.Owner); err != nil {
		r.log.Warn("leave relay group on stop", "err", err)
	}
	r.log.Info("relay stopped", "released_shards", leaseShards(r.leases))
	r.m.shardsOwned.Set(0)
}

// wait sleeps up to d (or until the next lease round trip) unless a
// notification, a stop or cancellation comes first.
func (r *Relay) wait(ctx context.Context, d time.Duration) {
	if until := time.Until(r.nextMaintain); until < d {
		d = max(until, 0)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.wake:
	case <-r.life.SoftStop():
	case <-ctx.Done():
	}
}

// backoff waits the next exponential, jittered retry interval; a stop
// interrupts it (a notification does not: the sink is the problem).
func (r *Relay) backoff(ctx context.Context) { r.backoffFor(ctx, r.retry.NextBackOff()) }

// backoffFor waits d unless a stop comes first.
func (r *Relay) backoffFor(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.life.SoftStop():
	case <-ctx.Done():
	}
}

// readAhead is the read of the next batch, run while the current one is
// published. It skips the current batch's rows and those of the marker in
// flight, so nothing is read twice. Its rows are published only after the
// current batch was ACKed in full, under the same leases; otherwise they
// are dropped and read again. Per aggregate, the rows it finds follow the
// current batch's (a later revision becomes visible only after the earlier
// ones), so order is unchanged.
type readAhead struct {
	done chan struct{}
	rows []core.OutboxRow
	err  error
}

func (r *Relay) readAhead(ctx context.Context, shards []int, perShard int, skip []int64, order core.ReadOrder) *readAhead {
	a := &readAhead{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.rows, a.err = r.store.ReadBatchSkipping(ctx, shards, perShard, skip, order)
	}()
	return a
}

// wait returns the read's result once it is done (nothing for nil).
func (a *readAhead) wait() ([]core.OutboxRow, error) {
	if a == nil {
		return nil, nil
	}
	<-a.done
	return a.rows, a.err
}

// markJob is the marker of a fully ACKed batch, written in the background
// while the loop reads and publishes the next batch. The next read skips
// the job's rows, so nothing is read twice, and since that batch is only
// published after this one's ACK, per-aggregate order is unchanged. If the
// marker fails, its rows stay unrelayed and are sent again (same IDs).
type markJob struct {
	refs   []core.RowRef
	leases []core.Lease
	done   chan struct{}
	marked int
	refuse int
	err    error
}

func (j *markJob) rowIDs() []int64 {
	ids := make([]int64, len(j.rowRefs()))
	for i, r := range j.rowRefs() {
		ids[i] = r.ID
	}
	return ids
}

func (j *markJob) rowRefs() []core.RowRef {
	if j == nil {
		return nil
	}
	return j.refs
}

func (r *Relay) startMark(ctx context.Context, j *markJob) *markJob {
	j.done = make(chan struct{})
	go func() {
		defer close(j.done)
		j.marked, j.refuse, j.err = r.store.MarkRelayed(ctx, j.refs, j.leases)
	}()
	return j
}

// awaitMark waits for j's marker and accounts for its outcome.
func (r *Relay) awaitMark(j *markJob) {
	if j == nil {
		return
	}
	<-j.done
	switch {
	case j.err != nil:
		// The records are out; without a marker they will be sent again with
		// the same event IDs. That is the safe side.
		r.log.Error("write relay markers", "rows", len(j.refs), "err", j.err)
		if r.fences != nil {
			// Without the markers, these committed rows would be read and
			// sent again: fence their shards, which marks them first.
			for _, ref := range j.refs {
				r.fences.Need(ref.Shard)
			}
		}
	case j.refuse > 0:
		r.m.fenced.Add(float64(j.refuse))
		r.log.Warn("markers refused: a lease was taken over; its new owner resends", "refused", j.refuse, "marked", j.marked)
		r.nextMaintain = time.Time{}
	}
}

// relayBatch publishes rows. When the whole batch was ACKed it returns the
// marker job for the caller to run; otherwise it marks what may be marked,
// parks what was rejected for good and backs off on retryable failures
// itself. It returns errCrash only when the crash hook fired. carry are
// the rows of the marker still in flight, which an exactly-once publish
// records as unmarked.
func (r *Relay) relayBatch(ctx context.Context, rows []core.OutboxRow, carry []core.RowRef) (*markJob, error) {
	batch := make([]core.Envelope, len(rows))
	for i, row := range rows {
		batch[i] = row.Envelope
	}
	if h := r.cfg.Hooks; h != nil && h.BeforePublish != nil {
		h.BeforePublish(batch)
	}
	// A relay that was paused (SIGSTOP, GC, a stalled hook) may have lost its
	// leases meanwhile: publishing now could interleave with the new owner's
	// sends. Abandon instead, and let the next lease round trip decide.
	if margin := r.cfg.LeaseTTL / 10; time.Until(r.deadline) < margin {
		r.m.abandoned.Inc()
		r.log.Warn("abandoning batch: leases expire before it could be published", "rows", len(rows),
			"lease_deadline_in", time.Until(r.deadline).String())
		r.nextMaintain = time.Time{}
		return nil, nil
	}
	if h := r.cfg.Hooks; h != nil && h.UnsafeMarkBeforeAck {
		return nil, r.unsafeMarkThenPublish(ctx, rows, batch)
	}
	pubCtx, cancel := context.WithDeadline(ctx, r.deadline)
	start := time.Now()
	var err error
	if r.fences != nil {
		err = r.fences.Publish(pubCtx, rows, batch, carry)
	} else {
		err = PublishBatch(pubCtx, r.sink, batch)
	}
	cancel()
	r.m.publishSeconds.Observe(time.Since(start).Seconds())
	r.m.batchSize.Observe(float64(len(batch)))
	if ctx.Err() != nil {
		return nil, nil // hard stop: nothing is marked, everything will be resent
	}

	// Mark only records with no failed predecessor of the same aggregate in
	// this batch: a later revision must not be marked while an earlier one
	// is still to be sent.
	st, failed := settle(batch, err)
	var refs []core.RowRef
	for _, i := range st.Mark {
		refs = append(refs, rows[i].RowRef)
	}
	r.m.published.Add(float64(st.Acked))

	if st.Acked > 0 {
		if h := r.cfg.Hooks; h != nil && h.AfterAck != nil {
			if herr := h.AfterAck(batch); herr != nil {
				return nil, errCrash
			}
		}
	}
	var job *markJob
	if len(refs) > 0 {
		if h := r.cfg.Hooks; h != nil && h.BeforeMarker != nil {
			h.BeforeMarker()
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
			r.m.parked.Inc()
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
			r.m.parked.Inc()
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
		r.m.retries.Inc()
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

// listen turns outbox notifications into wake-ups on a dedicated
// connection, reconnecting with backoff; each (re)connect wakes the loop
// once, for notifications missed while disconnected.
func (r *Relay) listen(ctx context.Context) {
	bo := backoff.NewExponentialBackOff()
	bo.MaxInterval = 5 * time.Second
	for ctx.Err() == nil {
		err := r.store.Listen(ctx, r.poke)
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("outbox notifications lost; polling until reconnected", "err", err)
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// afterCursor keeps the rows above *cursor and moves it to the largest id
// read: the unsafe "position > last" reading of Hooks.UnsafeCursor.
func afterCursor(rows []core.OutboxRow, cursor *int64) []core.OutboxRow {
	var kept []core.OutboxRow
	last := *cursor
	for _, row := range rows {
		if row.ID > *cursor {
			kept = append(kept, row)
		}
		last = max(last, row.ID)
	}
	*cursor = last
	return kept
}

func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// StatsWait is how long a relay waits before it reads its gauges again:
// interval, or, when reading them took longer than a tenth of that, ten
// times as long as it took. The backlog query reads every pending row
// (about a second of database time per million), and at the default 2 s it
// slowed the drain of a 1M backlog by a quarter to a third.
func StatsWait(interval, took time.Duration) time.Duration { return max(interval, 10*took) }

// refreshStats updates the backlog, parked and open-transaction gauges,
// waiting StatsWait between reads.
func (r *Relay) refreshStats(ctx context.Context) {
	t := time.NewTimer(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		began := time.Now()
		st, err := r.store.Status(ctx)
		if err == nil {
			r.m.backlog.Set(float64(st.Backlog))
			r.m.oldestAge.Set(st.OldestUnrelayedAge)
			r.m.parked.Set(float64(len(st.Parked)))
		} else if ctx.Err() == nil {
			r.log.Warn("outbox status", "err", err)
		}
		if age, err := r.store.OldestOpenTransactionAge(ctx); err == nil {
			r.m.heldByOpenTx.Set(age.Seconds())
		}
		t.Reset(StatsWait(r.cfg.StatsInterval, time.Since(began)))
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
