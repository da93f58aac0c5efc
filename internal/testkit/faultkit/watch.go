package faultkit

import (
	"context"
	"fmt"
	"time"

	"github.com/posthorn/posthorn/demo"
)

// A waiter is one recovery figure still being measured: a fault that has
// ended but whose effect on delivery has not yet healed.
type waiter struct {
	kind  string
	start time.Time
	// done reports whether the fault has been recovered from.
	done func(p demo.Progress) bool
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
	if r.hitsRelay(kind) {
		r.waiters = append(r.waiters, waiter{kind: relayKey(kind), start: time.Now(), done: func(p demo.Progress) bool {
			return p.Unrelayed <= backlog
		}})
	}
}

// hitsRelay reports whether a fault kind can hold the relays back.
func (r *runState) hitsRelay(kind string) bool {
	switch kind {
	case FaultKillRelay, FaultFreezeRelay, FaultTerminate, FaultBroker, FaultLeaders:
		return true
	}
	return r.isScripted(kind)
}

// relayKey is the Recovery key of the relay-backlog figure of a fault kind.
func relayKey(kind string) string { return kind + " (relay backlog)" }

// Recovery keys of the first progress after a scripted fault's heal.
func relayMovesKey(kind string) string    { return kind + " (relay moves)" }
func consumersMoveKey(kind string) string { return kind + " (consumers move)" }

func (r *runState) isScripted(kind string) bool {
	for _, sf := range r.cfg.Scripted {
		if sf.Name == kind {
			return true
		}
	}
	return false
}

// progressAfter registers the first progress after a heal: the relays
// marked an event relayed that was not marked when the fault was healed
// (while events waited), and every consumer applied one more event. Events
// posted meanwhile count as progress too: the load goes on.
func (r *runState) progressAfter(kind string, at demo.Progress) {
	relayed := at.Events - at.Unrelayed
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.waiters = append(r.waiters,
		waiter{kind: relayMovesKey(kind), start: now, done: func(p demo.Progress) bool {
			return p.Events-p.Unrelayed > relayed || p.Unrelayed == 0 && p.Events == at.Events
		}},
		waiter{kind: consumersMoveKey(kind), start: now, done: func(p demo.Progress) bool {
			for c, a := range p.Applied {
				if a <= at.Applied[c] && a < p.Events {
					return false
				}
			}
			return len(p.Applied) > 0
		}})
}

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
// (MissingReport), the relays' view too when events are unrelayed, and the
// consumers' goroutines. The goroutines come from SIGQUIT and go,
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
	} else if rerr == nil && p.Unrelayed > 0 {
		// A consumer waits on events the relays have not sent: say why
		// they have not (a park, a shard without a live lease).
		if relays, err := r.s.RelayReport(ctx); err == nil {
			report += "  the relays, with events unrelayed:\n" + relays
		}
	}
	if rerr != nil {
		report = "report unavailable: " + rerr.Error()
	}
	err := fmt.Errorf("LIVENESS: %s for %s (%d committed events, %d unrelayed, applied %v)",
		what, stallAfter, p.Events, p.Unrelayed, p.Applied)
	r.cfg.Logf("%v:\n%s", err, report)
	r.logGoroutines(procs, "when it stalled")
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

// logGoroutines stops each of procs with SIGQUIT and logs its goroutines,
// summarised; when says at what point.
func (r *runState) logGoroutines(procs []*Proc, when string) {
	for _, c := range procs {
		c.Quit()
		r.cfg.Logf("goroutines of %s %s:\n%s", c.Name, when, SummarizeDump(LastRun(c.LogPath())))
	}
}
