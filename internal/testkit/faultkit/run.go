package faultkit

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/relay"
)

// Consumers are the example consumers every run checks.
var Consumers = []string{projection.Name, auditlog.Name}

// RunConfig is the load and the faults of one run. Counts are spread at
// random moments over the load's duration (Postings / Rate).
type RunConfig struct {
	Postings int
	Rate     float64
	Workers  int
	Accounts int
	// KillRelays and KillConsumers are SIGKILLs, each followed by a restart
	// after a random pause of up to KillPause.
	KillRelays, KillConsumers int
	KillPause                 time.Duration
	// Freezes SIGSTOP a relay for FreezeFor (more than its lease), then SIGCONT.
	Freezes   int
	FreezeFor time.Duration
	// Terminations run pg_terminate_backend on relay and consumer sessions.
	Terminations int
	// BrokerOutages kill the broker for BrokerDown and restart it.
	BrokerOutages int
	BrokerDown    time.Duration
	// LeaderMoves elect new partition leaders (SystemConfig.BrokerNodes > 1).
	LeaderMoves int
	// Holds are transactions held open for HoldFor that write outbox rows;
	// every other one rolls back at the end instead of committing.
	Holds   int
	HoldFor time.Duration
	// RollbackEvery is the pace of short postings on load accounts that
	// roll back (0: none).
	RollbackEvery time.Duration
	// Scripted are faults at fixed moments of the load (a partition),
	// each healed after its duration while the load goes on.
	Scripted []ScriptedFault
	// Settle selects how the run ends: SettleDelivered waits until every
	// event is applied by both consumers; SettleAllSeen (control without
	// the inbox) until every event reached the consumers at least once;
	// SettleQuiet (control with events lost) until the backlog is empty and
	// the consumers' tables stop changing.
	Settle       Settle
	DrainTimeout time.Duration
	Seed         uint64
	Logf         func(string, ...any)
}

// ScriptedFault is a fault injected At after the load began and healed
// For later. Inject makes it and returns its heal.
type ScriptedFault struct {
	Name    string
	At, For time.Duration
	Inject  func(ctx context.Context) (heal func() error, err error)
}

// Settle is how a run waits at its end.
type Settle int

// Settle modes.
const (
	SettleDelivered Settle = iota
	SettleAllSeen
	SettleQuiet
)

// withDefaults fills the zero fields; a relay is frozen for three of its
// leases (leaseTTL) by default.
func (cfg RunConfig) withDefaults(leaseTTL time.Duration) RunConfig {
	cfg.Workers = cmp.Or(cfg.Workers, 8)
	cfg.Accounts = cmp.Or(cfg.Accounts, demo.DefaultAccounts)
	cfg.KillPause = cmp.Or(cfg.KillPause, 500*time.Millisecond)
	cfg.FreezeFor = cmp.Or(cfg.FreezeFor, 3*leaseTTL)
	cfg.BrokerDown = cmp.Or(cfg.BrokerDown, 3*time.Second)
	cfg.HoldFor = cmp.Or(cfg.HoldFor, 20*time.Second)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, 3*time.Minute)
	cfg.Seed = cmp.Or(cfg.Seed, uint64(time.Now().UnixNano()))
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	return cfg
}

// runState is one run: its configuration, the figures it gathers and the
// bookkeeping of the faults in flight.
type runState struct {
	s     *System
	cfg   RunConfig
	start time.Time
	// rng decides the plan, which process a fault hits and kill pauses;
	// only the goroutine of Run draws from it, so a seed replays a run's
	// choices.
	rng      *rand.Rand
	mu       sync.Mutex
	fig      Figures
	waiters  []waiter
	progress atomic.Pointer[demo.Progress]
	// stall is set when the watchdog found a part stalled; cancel then
	// ends the run.
	stall  atomic.Pointer[error]
	cancel context.CancelFunc
	// async are the faults that last and the rollback trickle; faultErr
	// is the first error one of them or an injection returned.
	async    sync.WaitGroup
	faultErr atomic.Pointer[error]
	// busy holds the processes a fault is acting on (tryBusy).
	busy sync.Map
	// holds counts the held transactions so far; odd ones roll back.
	holds int
}

// Run puts the load on s while injecting the configured faults, waits for
// the end state, stops the relays and consumers and verifies the
// invariants. An error means the run itself failed (a process would not
// start, the load could not post); broken invariants are in Figures.Report.
func Run(ctx context.Context, s *System, cfg RunConfig) (Figures, error) {
	cfg = cfg.withDefaults(s.cfg.LeaseTTL)
	r := &runState{s: s, cfg: cfg, start: time.Now(), rng: rand.New(rand.NewPCG(cfg.Seed, 1)),
		fig: Figures{Faults: map[string]int{}, Recovery: map[string][]time.Duration{}}}
	cfg.Logf("fault run: seed %d, %d postings at %.0f/s", cfg.Seed, cfg.Postings, cfg.Rate)

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	r.cancel = cancelRun
	s.Supervise(runCtx, cfg.Logf)
	go r.monitor(runCtx)

	if err := r.loadWithFaults(runCtx); err != nil {
		return r.fig, err
	}
	cfg.Logf("load done after %s; settling", r.fig.LoadTime.Round(time.Millisecond))

	drainStart := time.Now()
	if err := r.settle(runCtx); err != nil {
		if serr := r.stallErr(); serr != nil {
			return r.fig, serr
		}
		r.unsettled(ctx, cancelRun)
		return r.fig, err
	}
	r.fig.DrainTime = time.Since(drainStart)
	cancelRun() // the supervisors must not restart what StopWorkers stops
	s.StopWorkers()
	err := r.verify(ctx) // before r.fig is read: verify completes it
	return r.fig, err
}

// loadWithFaults runs the load, the rollback trickle and the fault plan
// side by side, waits until all three are over and starts any process a
// fault left down, so that settling finds every part running.
func (r *runState) loadWithFaults(ctx context.Context) error {
	loadDone := make(chan error, 1)
	var loadRes demo.LoadResult
	go func() {
		var err error
		loadRes, err = demo.Load(ctx, demo.LoadConfig{
			BaseURL: r.s.APIURL, Postings: r.cfg.Postings, Workers: r.cfg.Workers, Accounts: r.cfg.Accounts,
			AccountPrefix: "acc-", Rate: r.cfg.Rate, KeyPrefix: fmt.Sprintf("fault-%d-", r.cfg.Seed), Seed: r.cfg.Seed,
		})
		loadDone <- err
	}()
	stopTrickle := make(chan struct{})
	if r.cfg.RollbackEvery > 0 {
		r.async.Go(func() { r.trickle(ctx, stopTrickle) })
	}
	r.inject(ctx, r.plan())

	err := <-loadDone
	r.fig.Postings, r.fig.LoadTime = loadRes.Postings, time.Since(r.start)
	close(stopTrickle)
	r.async.Wait()
	if err := r.stallErr(); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	if p := r.faultErr.Load(); p != nil {
		return *p
	}
	for _, p := range r.s.Procs() {
		if !p.Running() {
			if err := p.Start(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// unsettled logs, for a run that did not settle with events unrelayed, why
// the relays held them back: the ledger's view of them (a shard without a
// live lease, a parked aggregate, or every shard held and the events still
// not sent) and, with the supervisors stopped by stop, each relay's
// goroutines.
func (r *runState) unsettled(ctx context.Context, stop func()) {
	p, err := demo.ReadProgress(ctx, r.s.Ledger, r.s.Consumer, Consumers)
	if err != nil || p.Unrelayed == 0 {
		return
	}
	report, err := r.s.RelayReport(ctx)
	if err != nil {
		report = "report unavailable: " + err.Error()
	}
	r.cfg.Logf("%d events unrelayed after the drain; the relays:\n%s", p.Unrelayed, report)
	stop()
	r.logGoroutines(r.s.Relays, "after the drain")
}

// settle waits for the end state of cfg.Settle.
func (r *runState) settle(ctx context.Context) error {
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	var last string
	var stableSince time.Time
	for {
		p, err := demo.ReadProgress(ctx, r.s.Ledger, r.s.Consumer, Consumers)
		if err != nil {
			return err
		}
		switch r.cfg.Settle {
		case SettleDelivered:
			if p.Delivered() {
				return nil
			}
		case SettleAllSeen, SettleQuiet:
			// Without the inbox there are no applied rows to count: the
			// audit log (one row per event ID) and the projection's
			// revision sum show whether consumers still move.
			var audit, revs int64
			if err := r.s.Consumer.QueryRow(ctx, `SELECT (SELECT count(*) FROM audit_log), (SELECT coalesce(sum(revision), 0) FROM projection_balances)`).Scan(&audit, &revs); err != nil {
				return err
			}
			state := fmt.Sprintf("%d %v %d %d", p.Unrelayed, p.Applied, audit, revs)
			if state != last {
				last, stableSince = state, time.Now()
			}
			// SettleAllSeen: every event reached the consumers at least
			// once (the audit log keeps one row per event ID), then a
			// short calm. SettleQuiet: events may be lost for good, so
			// only a longer calm.
			seen := r.cfg.Settle == SettleQuiet || audit >= p.Events
			calm := 5 * time.Second
			if r.cfg.Settle == SettleQuiet {
				calm = 20 * time.Second
			}
			if p.Unrelayed == 0 && seen && time.Since(stableSince) > calm {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled within %s: %d events, %d unrelayed, applied %v (last state: unrelayed, applied, audit-log rows, projected revisions: %s)",
				r.cfg.DrainTimeout, p.Events, p.Unrelayed, p.Applied, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// verify checks the invariants over both databases, with the workers
// stopped, and completes the figures.
func (r *runState) verify(ctx context.Context) error {
	rep, err := demo.Verify(ctx, r.s.Ledger, r.s.Consumer, demo.VerifyOptions{RolledBack: r.fig.RolledBack})
	if err != nil {
		return err
	}
	// A relay mends rows its reads stepped over once its audit finds
	// them; the run would then pass, so the finding fails it here.
	for _, p := range r.s.Relays {
		if found := Matching(p.LogPath(), relay.ErrRowsBelowMarks.Error(), 5); found != "" {
			return fmt.Errorf("%s found committed rows below its low-water marks:\n%s", p.Name, found)
		}
	}
	r.fig.Report = rep
	r.fig.Events = rep.Events
	r.fig.Duplicates = rep.DuplicatesSuppressed
	r.fig.Crashes = r.s.Crashes()
	r.fig.Rejoins = r.s.Rejoins()
	r.fig.FirstApplied = r.s.FirstApplied()
	r.fig.StaticMembers = r.s.cfg.StaticMembers
	r.fig.Elapsed = time.Since(r.start)
	return nil
}
