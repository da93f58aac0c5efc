package polling

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/internal/delivery"
	"github.com/posthorn/posthorn/relay/internal/historyhold"
	"github.com/posthorn/posthorn/relay/internal/lifecycle"
	"github.com/posthorn/posthorn/relay/internal/relaymetrics"
	"github.com/posthorn/posthorn/relay/internal/standbygate"
)

// errCrash ends the loop without markers or lease release (Hooks.AfterAck).
var errCrash = errors.New("relay crashed (test hook)")

// Relay moves outbox rows of its leased shards to the sink. See the package
// documentation for its invariants.
type Relay struct {
	cfg   relay.Settings
	hooks Hooks
	store Store
	sink  core.Sink
	// fences is set in exactly-once mode (exactly_once.go).
	fences *delivery.Fences
	// standby is set when StandbyFlush is required (relay/internal/standbygate).
	standby *standbygate.Gate
	m       *relaymetrics.Metrics
	log     *slog.Logger

	life    *lifecycle.Lifecycle
	wake    chan struct{}
	crashed atomic.Bool

	// Owned by the loop goroutine.
	leases       []core.Lease
	deadline     time.Time
	nextMaintain time.Time
	retry        *backoff.ExponentialBackOff
	stuck        *delivery.StuckTracker
	history      *historyhold.Hold
}

// New returns a relay over store that publishes to sink. It does not start
// it; cfg's zero fields take their defaults and the rest are validated
// (relay.Settings.Checked). The relay reads no CDC setting.
func New(store Store, sink core.Sink, cfg relay.Settings) (*Relay, error) {
	return NewWithHooks(store, sink, cfg, nil)
}

// NewWithHooks is New with test hooks (nil: none), for tests and the fault
// suite's negative controls only.
func NewWithHooks(store Store, sink core.Sink, cfg relay.Settings, hooks *Hooks) (*Relay, error) {
	cfg, err := cfg.Checked()
	if err != nil {
		return nil, err
	}
	hooks = cmp.Or(hooks, &Hooks{})
	log := cfg.Logger.With("component", "relay", "owner", cfg.Owner)
	p, err := delivery.NewParts(cfg, sink, hooks.UnsafeSkipPositions, log)
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, hooks: *hooks, store: store, sink: sink, log: log, wake: make(chan struct{}, 1),
		m: p.Metrics, life: p.Life, retry: p.Retry, stuck: p.Stuck, fences: p.Fences, standby: p.Standby, history: p.History}, nil
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
	if r.hooks.UnsafeOrderByXID {
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
					// Never past the leases' renewal.
					r.life.Sleep(ctx, min(r.retry.NextBackOff(), r.cfg.LeaseTTL/4, time.Until(r.nextMaintain)))
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
			r.m.ReadFailed(err)
			r.log.Error("read outbox", "err", err)
			r.backoff(ctx)
			continue
		}
		if r.hooks.UnsafeCursor {
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
		if !r.history.Accepted(ctx) {
			settle()
			r.life.Sleep(ctx, historyhold.Poll)
			continue
		}
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
	r.m.ShardsOwned.Set(0)
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
func (r *Relay) backoff(ctx context.Context) { r.life.Sleep(ctx, r.retry.NextBackOff()) }

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

func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
