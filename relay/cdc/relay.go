package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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

var (
	errCrash     = errors.New("CDC relay crashed (test hook)")
	errLeaseLost = errors.New("slot lease lost")
	errStopping  = errors.New("stopping")
	// errHistoryChanged ends a session whose held rows came from a ledger
	// that failed over meanwhile.
	errHistoryChanged = errors.New("the ledger failed over while rows were held: they are dropped and read from the new primary")
)

// Relay streams the outbox from a replication slot to a sink. See the
// package documentation for its invariants.
type Relay struct {
	cfg   relay.Settings
	hooks Hooks
	store Source
	outbx OutboxStore
	sink  core.Sink
	// fences is set in exactly-once mode (deliver.go).
	fences *delivery.Fences
	// standby is set when StandbyFlush is required (deliver.go).
	standby *standbygate.Gate
	// history holds publishing while the ledger's history is not accepted.
	history *historyhold.Hold
	bm      *relaymetrics.Metrics
	m       *metrics
	log     *slog.Logger

	life     *lifecycle.Lifecycle
	crashed  atomic.Bool
	lagNanos atomic.Int64 // commit time (unix ns) of the oldest unconfirmed transaction; 0 none

	// Owned by the loop goroutine.
	lease        *Lease
	deadline     time.Time // lease expiry as this relay knows it
	nextMaintain time.Time
	retry        *backoff.ExponentialBackOff
	stuck        *delivery.StuckTracker
	parked       map[core.AggregateKey]bool
	filterUntil  LSN // streamed rows committed up to here may already be marked
	stream       Stream
	reader       *streamReader // reads stream ahead; confirms through it
	confirmed    LSN
	// published is what this relay published on the ledger's timeline,
	// kept across sessions (branch.go).
	published publishedLog
}

// New returns a CDC relay that streams the outbox from source, reads and
// parks through outbox, and publishes to sink. It does not start it and
// does not contact the server; Check does. cfg's zero fields take their
// defaults and the rest are validated (relay.Settings.Checked); the relay
// reads no polling setting (PollInterval, MinPollInterval).
func New(outbox OutboxStore, source Source, sink core.Sink, cfg relay.Settings) (*Relay, error) {
	return NewWithHooks(outbox, source, sink, cfg, nil)
}

// NewWithHooks is New with test hooks (nil: none), for tests and negative
// controls only.
func NewWithHooks(outbox OutboxStore, source Source, sink core.Sink, cfg relay.Settings, hooks *Hooks) (*Relay, error) {
	cfg, err := cfg.Checked()
	if err != nil {
		return nil, err
	}
	hooks = cmp.Or(hooks, &Hooks{})
	log := cfg.Logger.With("component", "relay", "mode", "cdc", "owner", cfg.Owner, "slot", cfg.CDC.Slot)
	p, err := delivery.NewParts(cfg, sink, hooks.UnsafeSkipPositions, log)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.CDC.Slot)
	if err != nil {
		return nil, fmt.Errorf("CDC metrics: %w", err)
	}
	return &Relay{cfg: cfg, hooks: *hooks, store: source, outbx: outbox, sink: sink, m: m, log: log,
		bm: p.Metrics, life: p.Life, retry: p.Retry, stuck: p.Stuck, fences: p.Fences, standby: p.Standby, history: p.History}, nil
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
func (r *Relay) Ready() error { return r.life.Ready() }

// Owner is the name this relay holds the lease under.
func (r *Relay) Owner() string { return r.cfg.Owner }

func (r *Relay) stopping() bool { return r.life.Stopping() }

// run acquires the slot's lease, streams while holding it, and stands by
// otherwise.
func (r *Relay) run(ctx context.Context) {
	for !r.stopping() && ctx.Err() == nil {
		if r.lease == nil {
			if !r.acquire(ctx) {
				r.life.Sleep(ctx, r.cfg.LeaseTTL/4)
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
			r.dropFences()
		case err == nil, errors.Is(err, errStopping), ctx.Err() != nil:
		default:
			r.log.Error("CDC stream ended; restarting from the confirmed position", "err", err)
			r.life.SetReady(err)
			// The next session renews the lease first: wait no longer
			// than the lease leaves room for.
			r.life.Sleep(ctx, min(r.retry.NextBackOff(), time.Until(r.deadline)-r.cfg.LeaseTTL/4))
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
	r.dropFences()
	r.log.Info("CDC relay stopped")
}

func (r *Relay) acquire(ctx context.Context) bool {
	sent := time.Now()
	l, ok, err := r.store.AcquireLease(ctx, r.cfg.CDC.Slot, r.cfg.Owner, r.cfg.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error("acquire slot lease", "err", err)
			r.life.SetReady(err)
		}
		return false
	}
	r.life.SetReady(nil)
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
		r.life.SetReady(err)
		if time.Now().After(r.deadline) {
			return false, errLeaseLost
		}
		r.nextMaintain = sent.Add(min(r.cfg.LeaseTTL/10, time.Second))
		return false, nil
	}
	if !ok {
		return false, errLeaseLost
	}
	r.life.SetReady(nil)
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

func (r *Relay) backoff(ctx context.Context) { r.life.Sleep(ctx, r.retry.NextBackOff()) }

func (r *Relay) closeStream(ctx context.Context) {
	if r.stream == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if r.reader != nil {
		r.reader.close(cctx)
		r.reader = nil
	}
	_ = r.stream.Close(cctx)
	r.stream = nil
}
