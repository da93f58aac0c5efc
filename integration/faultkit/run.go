package faultkit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/demo"
)

// Fault kinds, as counted in Figures.
const (
	FaultKillRelay    = "sigkill relay"
	FaultKillConsumer = "sigkill consumer"
	FaultFreezeRelay  = "sigstop relay past its lease"
	FaultTerminate    = "pg_terminate_backend relay+consumer sessions"
	FaultBroker       = "broker outage"
	FaultLeaders      = "partition leaders moved"
	FaultHeldCommit   = "transaction held open, then committed"
	FaultHeldRollback = "transaction held open, then rolled back"
	FaultRollback     = "posting rolled back"
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

// Settle is how a run waits at its end.
type Settle int

// Settle modes.
const (
	SettleDelivered Settle = iota
	SettleAllSeen
	SettleQuiet
)

// Figures are what a run measured.
type Figures struct {
	Postings   int
	Events     int64
	Faults     map[string]int
	Recovery   map[string][]time.Duration
	Takeovers  []time.Duration
	Terminated int
	Crashes    int
	// Rejoins are the consumers' re-joins of a stalled Kafka group, as
	// they logged them (System.Rejoins).
	Rejoins    []string
	RolledBack []string
	// Duplicates per consumer: deliveries the inbox absorbed.
	Duplicates map[string]int64
	LoadTime   time.Duration
	DrainTime  time.Duration
	Elapsed    time.Duration
	Report     demo.Report
}

// TotalFaults sums the injected faults.
func (f Figures) TotalFaults() int {
	n := 0
	for _, c := range f.Faults {
		n += c
	}
	return n
}

// Kills is the number of SIGKILLs of relays and consumers.
func (f Figures) Kills() int { return f.Faults[FaultKillRelay] + f.Faults[FaultKillConsumer] }

type waiter struct {
	kind  string
	start time.Time
	// done reports whether the fault has been recovered from.
	done func(p demo.Progress) bool
}

type runState struct {
	s        *System
	cfg      RunConfig
	mu       sync.Mutex
	fig      Figures
	waiters  []waiter
	progress atomic.Pointer[demo.Progress]
	// stall is set when the watchdog found a part stalled; cancel then
	// ends the run.
	stall  atomic.Pointer[error]
	cancel context.CancelFunc
}

func (r *runState) count(kind string) {
	r.mu.Lock()
	r.fig.Faults[kind]++
	r.mu.Unlock()
}

// before is the progress seen when a fault starts, for recoverAfter.
func (r *runState) before() demo.Progress {
	if p := r.progress.Load(); p != nil {
		return *p
	}
	return demo.Progress{}
}

// backlogSlack is the unrelayed backlog under which the relay counts as
// back to normal after a fault (a few hundred ms of load).
const backlogSlack = 500

// stallAfter is how long the relays may mark nothing relayed, or a
// consumer apply nothing, while events wait for them before the run's
// watchdog declares a stall: far more than any fault of the suite
// interrupts delivery for (a broker outage, a lease takeover or a group's
// re-join take seconds), so a stall is a part that does not recover by
// itself, which fails the run.
const stallAfter = 2 * time.Minute

// recoverAfter registers the fault that just ended with two figures:
// consumers caught up (both have applied as many events as the ledger had
// committed when it ended) and, for faults that hit the relay, relay
// backlog back (unrelayed events back under what they were when the fault
// began, or backlogSlack).
func (r *runState) recoverAfter(kind string, before demo.Progress) {
	target := r.before().Events
	backlog := max(before.Unrelayed, backlogSlack)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiters = append(r.waiters, waiter{kind: kind, start: time.Now(), done: func(p demo.Progress) bool {
		for _, a := range p.Applied {
			if a < target {
				return false
			}
		}
		return p.Events > 0
	}})
	switch kind {
	case FaultKillRelay, FaultFreezeRelay, FaultTerminate, FaultBroker, FaultLeaders:
		r.waiters = append(r.waiters, waiter{kind: relayKey(kind), start: time.Now(), done: func(p demo.Progress) bool {
			return p.Unrelayed <= backlog
		}})
	}
}

// relayKey is the Recovery key of the relay-backlog figure of a fault kind.
func relayKey(kind string) string { return kind + " (relay backlog)" }

// monitor polls delivery progress, settles the recovery waiters and, when
// every event must be applied (SettleDelivered), watches for a stall.
func (r *runState) monitor(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	w := stallWatch{}
	for {
		p, err := demo.ReadProgress(ctx, r.s.Ledger, r.s.Consumer, Consumers)
		if err == nil {
			if r.cfg.Settle == SettleDelivered {
				if who := w.check(p, time.Now()); who != "" {
					r.stalled(ctx, who, p)
					return
				}
			}
			r.progress.Store(&p)
			r.mu.Lock()
			kept := r.waiters[:0]
			for _, w := range r.waiters {
				if w.done(p) {
					r.fig.Recovery[w.kind] = append(r.fig.Recovery[w.kind], time.Since(w.start))
				} else {
					kept = append(kept, w)
				}
			}
			r.waiters = kept
			r.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// relayWho is the name stallWatch gives the relays.
const relayWho = "relay"

// stallWatch tells which part stopped moving: the relays (no event marked
// relayed for stallAfter while some are not) or a consumer (none of its
// events applied for stallAfter while relayed ones are missing). A consumer
// can only apply what was relayed, so the relays' stall is not blamed on it.
type stallWatch struct {
	last    map[string]int64
	movedAt map[string]time.Time
}

// check records p at now and returns who has stalled, or "".
func (w *stallWatch) check(p demo.Progress, now time.Time) string {
	if w.last == nil {
		w.last, w.movedAt = map[string]int64{}, map[string]time.Time{}
	}
	relayed := p.Events - p.Unrelayed
	waiting := map[string]bool{relayWho: p.Unrelayed > 0}
	done := map[string]int64{relayWho: relayed}
	for c, a := range p.Applied {
		waiting[c], done[c] = a < relayed, a
	}
	for who, n := range done {
		if n != w.last[who] || !waiting[who] || w.movedAt[who].IsZero() {
			w.last[who], w.movedAt[who] = n, now
		} else if now.Sub(w.movedAt[who]) > stallAfter {
			return who
		}
	}
	return ""
}

// stalled ends the run with the evidence of a stall: for the relays, their
// leases, parked aggregates and unrelayed rows (RelayReport) and their
// goroutines; for a consumer, the broker's view of the groups (GroupReport),
// the relayed events it misses and whether the broker holds them
// (MissingReport), and the consumers' goroutines. The goroutines come from SIGQUIT and go,
// summarised, to the run's log.
func (r *runState) stalled(ctx context.Context, who string, p demo.Progress) {
	procs, what := r.s.Consumers, "consumer "+who+" applied nothing"
	report, rerr := r.s.GroupReport(ctx, Consumers)
	if rerr == nil {
		var missing string
		missing, rerr = r.s.MissingReport(ctx, who)
		report += missing
	}
	if who == relayWho {
		procs, what = r.s.Relays, "the relays marked nothing relayed"
		report, rerr = r.s.RelayReport(ctx)
	}
	if rerr != nil {
		report = "report unavailable: " + rerr.Error()
	}
	err := fmt.Errorf("LIVENESS: %s for %s (%d committed events, %d unrelayed, applied %v)",
		what, stallAfter, p.Events, p.Unrelayed, p.Applied)
	r.cfg.Logf("%v:\n%s", err, report)
	for _, c := range procs {
		c.Quit()
		r.cfg.Logf("goroutines of %s when it stalled:\n%s", c.Name, SummarizeDump(LastRun(c.LogPath())))
	}
	err = fmt.Errorf("%w:\n%s", err, report)
	r.stall.Store(&err)
	r.cancel()
}

// stallErr is the watchdog's verdict, nil unless a part stalled.
func (r *runState) stallErr() error {
	if p := r.stall.Load(); p != nil {
		return *p
	}
	return nil
}

type plannedFault struct {
	at   time.Duration
	kind string
}

// Run puts the load on s while injecting the configured faults, waits for
// the end state, stops the relays and consumers and verifies the
// invariants. An error means the run itself failed (a process would not
// start, the load could not post); broken invariants are in Figures.Report.
func Run(ctx context.Context, s *System, cfg RunConfig) (Figures, error) {
	if cfg.Workers == 0 {
		cfg.Workers = 8
	}
	if cfg.Accounts == 0 {
		cfg.Accounts = demo.DefaultAccounts
	}
	if cfg.KillPause == 0 {
		cfg.KillPause = 500 * time.Millisecond
	}
	if cfg.FreezeFor == 0 {
		cfg.FreezeFor = 3 * s.cfg.LeaseTTL
	}
	if cfg.BrokerDown == 0 {
		cfg.BrokerDown = 3 * time.Second
	}
	if cfg.HoldFor == 0 {
		cfg.HoldFor = 20 * time.Second
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 3 * time.Minute
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	start := time.Now()
	r := &runState{s: s, cfg: cfg, fig: Figures{Faults: map[string]int{}, Recovery: map[string][]time.Duration{}}}
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	cfg.Logf("fault run: seed %d, %d postings at %.0f/s", cfg.Seed, cfg.Postings, cfg.Rate)

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	r.cancel = cancelRun
	s.Supervise(runCtx, cfg.Logf)
	go r.monitor(runCtx)

	// The load.
	loadDone := make(chan error, 1)
	var loadRes demo.LoadResult
	go func() {
		var err error
		loadRes, err = demo.Load(runCtx, demo.LoadConfig{
			BaseURL: s.APIURL, Postings: cfg.Postings, Workers: cfg.Workers, Accounts: cfg.Accounts,
			AccountPrefix: "acc-", Rate: cfg.Rate, KeyPrefix: fmt.Sprintf("fault-%d-", cfg.Seed), Seed: cfg.Seed,
		})
		loadDone <- err
	}()
	loadFor := time.Duration(float64(cfg.Postings) / cfg.Rate * float64(time.Second))

	var async sync.WaitGroup
	var faultErr atomic.Pointer[error]
	fail := func(err error) {
		if err != nil && runCtx.Err() == nil {
			faultErr.CompareAndSwap(nil, &err)
			cfg.Logf("fault: %v", err)
		}
	}

	// The trickle of rolled-back postings on load accounts.
	stopTrickle := make(chan struct{})
	if cfg.RollbackEvery > 0 {
		async.Add(1)
		go func() {
			defer async.Done()
			trng := rand.New(rand.NewPCG(cfg.Seed, 2))
			for i := 0; ; i++ {
				select {
				case <-stopTrickle:
					return
				case <-runCtx.Done():
					return
				case <-time.After(cfg.RollbackEvery):
				}
				a := trng.IntN(cfg.Accounts)
				b := (a + 1 + trng.IntN(cfg.Accounts-1)) % cfg.Accounts
				ids, err := s.FaultPosting(runCtx, fmt.Sprintf("fault-%d-rollback-%d", cfg.Seed, i),
					[2]string{fmt.Sprintf("acc-%d", a), fmt.Sprintf("acc-%d", b)}, 0, true)
				if err != nil {
					fail(err)
					continue
				}
				r.mu.Lock()
				r.fig.RolledBack = append(r.fig.RolledBack, ids...)
				r.fig.Faults[FaultRollback]++
				r.mu.Unlock()
			}
		}()
	}

	// The plan: every fault at a random moment of the load.
	var plan []plannedFault
	add := func(kind string, n int) {
		for i := 0; i < n; i++ {
			at := time.Duration(float64(loadFor) * (0.05 + 0.85*rng.Float64()))
			plan = append(plan, plannedFault{at, kind})
		}
	}
	add(FaultKillRelay, cfg.KillRelays)
	add(FaultKillConsumer, cfg.KillConsumers)
	add(FaultFreezeRelay, cfg.Freezes)
	add(FaultTerminate, cfg.Terminations)
	add(FaultBroker, cfg.BrokerOutages)
	add(FaultLeaders, cfg.LeaderMoves)
	add(FaultHeldCommit, cfg.Holds)
	sort.Slice(plan, func(i, j int) bool { return plan[i].at < plan[j].at })

	// busy keeps two faults off one process at once (a kill of a frozen
	// relay would race its SIGCONT).
	var busy sync.Map
	tryBusy := func(p *Proc) bool { _, taken := busy.LoadOrStore(p, true); return !taken }
	release := func(p *Proc) { busy.Delete(p) }
	pick := func(ps []*Proc) *Proc {
		for _, i := range rng.Perm(len(ps)) {
			if tryBusy(ps[i]) {
				return ps[i]
			}
		}
		return nil
	}
	holds := 0
	for _, f := range plan {
		select {
		case <-runCtx.Done():
		case <-time.After(time.Until(start.Add(f.at))):
		}
		if runCtx.Err() != nil {
			break
		}
		switch f.kind {
		case FaultKillRelay, FaultKillConsumer:
			ps := s.Relays
			if f.kind == FaultKillConsumer {
				ps = s.Consumers
			}
			p := pick(ps)
			if p == nil {
				continue
			}
			pause := time.Duration(rng.Int64N(int64(cfg.KillPause)))
			before := r.before()
			err := s.KillAndRestart(runCtx, p, pause)
			release(p)
			fail(err)
			r.count(f.kind)
			r.recoverAfter(f.kind, before)
		case FaultFreezeRelay:
			i := rng.IntN(len(s.Relays))
			p := s.Relays[i]
			if !tryBusy(p) {
				continue
			}
			async.Add(1)
			go func() {
				defer async.Done()
				defer release(p)
				before := r.before()
				took, err := s.FreezeRelay(runCtx, i, cfg.FreezeFor)
				fail(err)
				r.mu.Lock()
				r.fig.Takeovers = append(r.fig.Takeovers, took)
				r.mu.Unlock()
				r.count(f.kind)
				r.recoverAfter(f.kind, before)
			}()
		case FaultTerminate:
			before := r.before()
			n, err := s.TerminateSessions(runCtx)
			fail(err)
			r.mu.Lock()
			r.fig.Terminated += n
			r.mu.Unlock()
			r.count(f.kind)
			r.recoverAfter(f.kind, before)
		case FaultBroker:
			if !tryBusy(s.Broker) {
				continue
			}
			async.Add(1)
			go func() {
				defer async.Done()
				defer release(s.Broker)
				before := r.before()
				fail(s.BrokerOutage(runCtx, cfg.BrokerDown))
				r.count(f.kind)
				r.recoverAfter(f.kind, before)
			}()
		case FaultLeaders:
			if !tryBusy(s.Broker) {
				continue
			}
			before := r.before()
			fail(s.MoveLeaders())
			release(s.Broker)
			r.count(f.kind)
			r.recoverAfter(f.kind, before)
		case FaultHeldCommit:
			rollback := holds%2 == 1
			n := holds
			holds++
			async.Add(1)
			go func() {
				defer async.Done()
				// Accounts of their own, so the held locks do not stall the load.
				accs := [2]string{fmt.Sprintf("held-%d-a", n), fmt.Sprintf("held-%d-b", n)}
				ids, err := s.FaultPosting(runCtx, fmt.Sprintf("fault-%d-held-%d", cfg.Seed, n), accs, cfg.HoldFor, rollback)
				if err != nil {
					fail(err)
					return
				}
				if rollback {
					r.mu.Lock()
					r.fig.RolledBack = append(r.fig.RolledBack, ids...)
					r.fig.Faults[FaultHeldRollback]++
					r.mu.Unlock()
					return
				}
				r.count(FaultHeldCommit)
				// Recovered once both consumers applied the held events.
				committed := time.Now()
				for runCtx.Err() == nil {
					ok := true
					for _, c := range Consumers {
						var n int
						if err := s.Consumer.QueryRow(runCtx, `SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND event_id = ANY($2) AND disposition = 'applied'`,
							c, ids).Scan(&n); err != nil || n < len(ids) {
							ok = false
						}
					}
					if ok {
						r.mu.Lock()
						r.fig.Recovery[FaultHeldCommit] = append(r.fig.Recovery[FaultHeldCommit], time.Since(committed))
						r.mu.Unlock()
						return
					}
					select {
					case <-runCtx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
		}
	}

	err := <-loadDone
	r.fig.Postings, r.fig.LoadTime = loadRes.Postings, time.Since(start)
	close(stopTrickle)
	async.Wait()
	if err := r.stallErr(); err != nil {
		return r.fig, err
	}
	if err != nil {
		return r.fig, fmt.Errorf("load: %w", err)
	}
	if p := faultErr.Load(); p != nil {
		return r.fig, *p
	}
	for _, p := range s.Procs() {
		if !p.Running() {
			if err := p.Start(runCtx); err != nil {
				return r.fig, err
			}
		}
	}
	cfg.Logf("load done after %s; settling", r.fig.LoadTime.Round(time.Millisecond))

	drainStart := time.Now()
	if err := r.settle(runCtx); err != nil {
		if serr := r.stallErr(); serr != nil {
			return r.fig, serr
		}
		return r.fig, err
	}
	r.fig.DrainTime = time.Since(drainStart)
	cancelRun() // the supervisors must not restart what StopWorkers stops
	s.StopWorkers()

	rep, err := demo.Verify(ctx, s.Ledger, s.Consumer, demo.VerifyOptions{RolledBack: r.fig.RolledBack})
	if err != nil {
		return r.fig, err
	}
	r.fig.Report = rep
	r.fig.Events = rep.Events
	r.fig.Duplicates = rep.DuplicatesSuppressed
	r.fig.Crashes = s.Crashes()
	r.fig.Rejoins = s.Rejoins()
	r.fig.Elapsed = time.Since(start)
	return r.fig, nil
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
			return fmt.Errorf("not settled within %s: %d events, %d unrelayed, applied %v", r.cfg.DrainTimeout, p.Events, p.Unrelayed, p.Applied)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// String renders the figures for the test log and the soak file.
func (f Figures) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "postings %d (load %s), events %d, elapsed %s, drain after load %s\n",
		f.Postings, f.LoadTime.Round(time.Second), f.Events, f.Elapsed.Round(time.Second), f.DrainTime.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "faults injected: %d (SIGKILLs %d)\n", f.TotalFaults(), f.Kills())
	kinds := make([]string, 0, len(f.Faults))
	for k := range f.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %-46s %5d", k, f.Faults[k])
		b.WriteString("\n")
		for _, key := range []string{relayKey(k), k} {
			if rec := f.Recovery[key]; len(rec) > 0 {
				what := "consumers caught up"
				if key != k {
					what = "relay backlog back"
				}
				p50, p95, mx := quantiles(rec)
				fmt.Fprintf(&b, "      %-20s p50 %8s  p95 %8s  max %8s  (n=%d)\n", what, p50, p95, mx, len(rec))
			}
		}
	}
	if len(f.Takeovers) > 0 {
		var parts []string
		for _, t := range f.Takeovers {
			if t < 0 {
				parts = append(parts, "none")
			} else {
				parts = append(parts, t.Round(10*time.Millisecond).String())
			}
		}
		fmt.Fprintf(&b, "  frozen relay's leases gone after: %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(&b, "  backend sessions terminated: %d; processes that exited on their own (restarted): %d\n", f.Terminated, f.Crashes)
	fmt.Fprintf(&b, "  consumer group re-joins after a stalled partition (the consumers' watchdog): %d\n", len(f.Rejoins))
	for _, r := range f.Rejoins {
		fmt.Fprintf(&b, "    %s\n", r)
	}
	fmt.Fprintf(&b, "  rolled-back events checked absent: %d\n", len(f.RolledBack))
	names := make([]string, 0, len(f.Duplicates))
	for n := range f.Duplicates {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "duplicates that arrived and were suppressed by the inbox, %s: %d\n", n, f.Duplicates[n])
	}
	b.WriteString("consumers caught up = time from the end of a fault until both consumers had applied as many events as the ledger held when it ended (held transactions: from commit until both applied its events); relay backlog back = until the unrelayed backlog was back under its size when the fault began (or 500)\n")
	if f.Report.Clean() {
		fmt.Fprintf(&b, "invariants: clean (%d events, relayed %d, applied once per consumer %v, %d accounts, balances equal)\n",
			f.Report.Events, f.Report.Relayed, f.Report.Applied, f.Report.Accounts)
	} else {
		b.WriteString("invariants VIOLATED:\n")
		for _, v := range f.Report.Violations {
			fmt.Fprintf(&b, "  %s\n", v)
		}
	}
	return b.String()
}

func quantiles(ds []time.Duration) (p50, p95, mx time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) time.Duration {
		return s[min(len(s)-1, int(q*float64(len(s))))].Round(10 * time.Millisecond)
	}
	return at(0.5), at(0.95), s[len(s)-1].Round(10 * time.Millisecond)
}
