package faultkit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
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

// kafkaLeaders is the busy key of leader moves on a real Kafka cluster.
var kafkaLeaders = &Proc{Name: "kafka leaders"}

type plannedFault struct {
	at       time.Duration
	kind     string
	scripted *ScriptedFault
}

// plan places every configured fault at a random moment of the load
// (between 5 % and 90 % of its duration), in the order they happen.
func (r *runState) plan() []plannedFault {
	loadFor := time.Duration(float64(r.cfg.Postings) / r.cfg.Rate * float64(time.Second))
	var plan []plannedFault
	for _, k := range []struct {
		kind string
		n    int
	}{
		{FaultKillRelay, r.cfg.KillRelays},
		{FaultKillConsumer, r.cfg.KillConsumers},
		{FaultFreezeRelay, r.cfg.Freezes},
		{FaultTerminate, r.cfg.Terminations},
		{FaultBroker, r.cfg.BrokerOutages},
		{FaultLeaders, r.cfg.LeaderMoves},
		{FaultHeldCommit, r.cfg.Holds},
	} {
		for i := 0; i < k.n; i++ {
			at := time.Duration(float64(loadFor) * (0.05 + 0.85*r.rng.Float64()))
			plan = append(plan, plannedFault{at: at, kind: k.kind})
		}
	}
	for i := range r.cfg.Scripted {
		sf := &r.cfg.Scripted[i]
		plan = append(plan, plannedFault{at: sf.At, kind: sf.Name, scripted: sf})
	}
	sort.Slice(plan, func(i, j int) bool { return plan[i].at < plan[j].at })
	return plan
}

// inject waits for each planned moment and injects the fault, until the
// plan is done or ctx ends. Faults that last (a freeze, a broker outage,
// a held transaction) run in goroutines of r.async.
func (r *runState) inject(ctx context.Context, plan []plannedFault) {
	for _, f := range plan {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(r.start.Add(f.at))):
		}
		if ctx.Err() != nil {
			return
		}
		if f.scripted != nil {
			r.scripted(ctx, f.scripted)
			continue
		}
		switch f.kind {
		case FaultKillRelay:
			r.kill(ctx, f.kind, r.s.Relays)
		case FaultKillConsumer:
			r.kill(ctx, f.kind, r.s.Consumers)
		case FaultFreezeRelay:
			r.freeze(ctx)
		case FaultTerminate:
			r.fault(ctx, f.kind, func() error {
				n, err := r.s.TerminateSessions(ctx)
				r.mu.Lock()
				r.fig.Terminated += n
				r.mu.Unlock()
				return err
			})
		case FaultBroker:
			if !r.tryBusy(r.s.Broker) {
				continue
			}
			r.async.Go(func() {
				defer r.release(r.s.Broker)
				r.fault(ctx, f.kind, func() error { return r.s.BrokerOutage(ctx, r.cfg.BrokerDown) })
			})
		case FaultLeaders:
			key := r.s.Broker
			if r.s.cfg.Kafka != nil {
				// On a real cluster a node's outage (a restart of
				// seconds) and a leader move go together: the move
				// elects among the nodes in sync.
				key = kafkaLeaders
			}
			if !r.tryBusy(key) {
				continue
			}
			r.fault(ctx, f.kind, func() error {
				defer r.release(key)
				return r.s.MoveLeaders()
			})
		case FaultHeldCommit:
			r.hold(ctx)
		}
	}
}

// scripted injects sf in the background, heals it after sf.For (also when
// the run ends early) and registers its recoveries from the heal on.
func (r *runState) scripted(ctx context.Context, sf *ScriptedFault) {
	r.async.Go(func() {
		began, beforeFault := time.Now(), r.before()
		heal, err := sf.Inject(ctx)
		if err != nil {
			r.fail(ctx, fmt.Errorf("%s: %w", sf.Name, err))
			return
		}
		r.count(sf.Name)
		r.cfg.Logf("%s: injected at %s", sf.Name, began.Sub(r.start).Round(10*time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(sf.For):
		}
		atHeal := r.before()
		if err := heal(); err != nil {
			// A heal that fails leaves rules behind: always an error.
			err = fmt.Errorf("%s: heal: %w", sf.Name, err)
			r.faultErr.CompareAndSwap(nil, &err)
			return
		}
		healed := time.Now()
		r.cfg.Logf("%s: healed at %s", sf.Name, healed.Sub(r.start).Round(10*time.Millisecond))
		r.mu.Lock()
		r.fig.Heals = append(r.fig.Heals, Heal{Fault: sf.Name, Began: began, Healed: healed})
		r.mu.Unlock()
		r.recoverAfter(sf.Name, beforeFault)
		r.progressAfter(sf.Name, atHeal)
	})
}

// fault runs one fault's injection, reports its error, counts it and
// registers its recovery from the progress seen when it began.
func (r *runState) fault(ctx context.Context, kind string, inject func() error) {
	before := r.before()
	r.fail(ctx, inject())
	r.count(kind)
	r.recoverAfter(kind, before)
}

func (r *runState) count(kind string) {
	r.mu.Lock()
	r.fig.Faults[kind]++
	r.mu.Unlock()
}

// fail keeps the first error of an injection that was not cut short by the
// end of the run; Run returns it once the load is over.
func (r *runState) fail(ctx context.Context, err error) {
	if err != nil && ctx.Err() == nil {
		r.faultErr.CompareAndSwap(nil, &err)
		r.cfg.Logf("fault: %v", err)
	}
}

// tryBusy claims p for one fault; busy keeps two faults off one process at
// once (a kill of a frozen relay would race its SIGCONT).
func (r *runState) tryBusy(p *Proc) bool { _, taken := r.busy.LoadOrStore(p, true); return !taken }

func (r *runState) release(p *Proc) { r.busy.Delete(p) }

// kill SIGKILLs one of ps that no other fault holds and restarts it after
// a random pause of up to KillPause.
func (r *runState) kill(ctx context.Context, kind string, ps []*Proc) {
	var p *Proc
	for _, i := range r.rng.Perm(len(ps)) {
		if r.tryBusy(ps[i]) {
			p = ps[i]
			break
		}
	}
	if p == nil {
		return
	}
	pause := time.Duration(r.rng.Int64N(int64(r.cfg.KillPause)))
	r.fault(ctx, kind, func() error {
		defer r.release(p)
		return r.s.KillAndRestart(ctx, p, pause)
	})
}

// freeze SIGSTOPs a random relay for FreezeFor, in the background, and
// records how long until its leases were gone.
func (r *runState) freeze(ctx context.Context) {
	i := r.rng.IntN(len(r.s.Relays))
	p := r.s.Relays[i]
	if !r.tryBusy(p) {
		return
	}
	r.async.Go(func() {
		defer r.release(p)
		r.fault(ctx, FaultFreezeRelay, func() error {
			took, err := r.s.FreezeRelay(ctx, i, r.cfg.FreezeFor)
			r.mu.Lock()
			r.fig.Takeovers = append(r.fig.Takeovers, took)
			r.mu.Unlock()
			return err
		})
	})
}

// hold posts, in the background, a transaction the fault hook holds open
// for HoldFor; every other one rolls back instead of committing. A
// committed one counts as recovered once both consumers applied its
// events.
func (r *runState) hold(ctx context.Context) {
	n := r.holds
	rollback := n%2 == 1
	r.holds++
	r.async.Go(func() {
		// Accounts of their own, so the held locks do not stall the load.
		accs := [2]string{fmt.Sprintf("held-%d-a", n), fmt.Sprintf("held-%d-b", n)}
		ids, err := r.s.FaultPosting(ctx, fmt.Sprintf("fault-%d-held-%d", r.cfg.Seed, n), accs, r.cfg.HoldFor, rollback)
		if err != nil {
			r.fail(ctx, err)
			return
		}
		if rollback {
			r.rolledBack(FaultHeldRollback, ids)
			return
		}
		r.count(FaultHeldCommit)
		committed := time.Now()
		if r.awaitApplied(ctx, ids) {
			r.mu.Lock()
			r.fig.Recovery[FaultHeldCommit] = append(r.fig.Recovery[FaultHeldCommit], time.Since(committed))
			r.mu.Unlock()
		}
	})
}

// awaitApplied polls until both consumers applied every event of ids
// (true) or ctx ends (false).
func (r *runState) awaitApplied(ctx context.Context, ids []string) bool {
	for ctx.Err() == nil {
		ok := true
		for _, c := range Consumers {
			var n int
			if err := r.s.Consumer.QueryRow(ctx, `SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND event_id = ANY($2) AND disposition = 'applied'`,
				c, ids).Scan(&n); err != nil || n < len(ids) {
				ok = false
			}
		}
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return false
}

// trickle posts, every RollbackEvery until stop closes or ctx ends, a
// short transfer between two load accounts that rolls back.
func (r *runState) trickle(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 2))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.RollbackEvery):
		}
		a := rng.IntN(r.cfg.Accounts)
		b := (a + 1 + rng.IntN(r.cfg.Accounts-1)) % r.cfg.Accounts
		ids, err := r.s.FaultPosting(ctx, fmt.Sprintf("fault-%d-rollback-%d", r.cfg.Seed, i),
			[2]string{fmt.Sprintf("acc-%d", a), fmt.Sprintf("acc-%d", b)}, 0, true)
		if err != nil {
			r.fail(ctx, err)
			continue
		}
		r.rolledBack(FaultRollback, ids)
	}
}

// rolledBack records the events of a rolled-back posting, which the final
// check must find nowhere, and counts the fault.
func (r *runState) rolledBack(kind string, ids []string) {
	r.mu.Lock()
	r.fig.RolledBack = append(r.fig.RolledBack, ids...)
	r.fig.Faults[kind]++
	r.mu.Unlock()
}
