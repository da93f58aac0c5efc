package faultkit

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/posthorn/posthorn/demo"
)

// Figures are what a run measured.
type Figures struct {
	Postings  int
	Events    int64
	Faults    map[string]int
	Recovery  map[string][]time.Duration
	Takeovers []time.Duration
	// Heals are the scripted faults, when each began and was healed.
	Heals      []Heal
	Terminated int
	Crashes    int
	// Rejoins are the consumers' re-joins of a stalled Kafka group, as
	// they logged them (System.Rejoins).
	Rejoins []string
	// FirstApplied is, for each consumer restart, the time from its start
	// to its first applied event (System.FirstApplied); StaticMembers says
	// whether the consumers were static group members.
	FirstApplied  []time.Duration
	StaticMembers bool
	RolledBack    []string
	// Duplicates per consumer: deliveries the inbox absorbed.
	Duplicates map[string]int64
	LoadTime   time.Duration
	DrainTime  time.Duration
	Elapsed    time.Duration
	Report     demo.Report
}

// Heal is when a scripted fault began and was healed.
type Heal struct {
	Fault         string
	Began, Healed time.Time
}

// AfterHeal returns, for the scripted fault kind, how long after its last
// heal the relays first marked an event, the consumers first applied one,
// the relay backlog was back and the consumers had caught up (0 when not
// measured).
func (f Figures) AfterHeal(kind string) (relayMoves, consumersMove, relayBack, caughtUp time.Duration) {
	last := func(key string) time.Duration {
		if d := f.Recovery[key]; len(d) > 0 {
			return d[len(d)-1]
		}
		return 0
	}
	return last(relayMovesKey(kind)), last(consumersMoveKey(kind)), last(relayKey(kind)), last(kind)
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

// String renders the figures for the test log and the soak file.
func (f Figures) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "postings %d (load %s), events %d, elapsed %s, drain after load %s\n",
		f.Postings, f.LoadTime.Round(time.Second), f.Events, f.Elapsed.Round(time.Second), f.DrainTime.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "faults injected: %d (SIGKILLs %d)\n", f.TotalFaults(), f.Kills())
	for _, k := range slices.Sorted(maps.Keys(f.Faults)) {
		fmt.Fprintf(&b, "  %-46s %5d", k, f.Faults[k])
		b.WriteString("\n")
		for _, key := range []string{relayMovesKey(k), consumersMoveKey(k), relayKey(k), k} {
			if rec := f.Recovery[key]; len(rec) > 0 {
				what := map[string]string{relayMovesKey(k): "relay moves", consumersMoveKey(k): "consumers move", relayKey(k): "relay backlog back", k: "consumers caught up"}[key]
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
	if len(f.FirstApplied) > 0 {
		membership := "dynamic"
		if f.StaticMembers {
			membership = "static"
		}
		p50, p95, mx := quantiles(f.FirstApplied)
		fmt.Fprintf(&b, "  consumer restarts (%s members), start to first applied event: p50 %s  p95 %s  max %s  (n=%d)\n", membership, p50, p95, mx, len(f.FirstApplied))
	}
	fmt.Fprintf(&b, "  consumer group re-joins after a stalled partition (the consumers' watchdog): %d\n", len(f.Rejoins))
	for _, r := range f.Rejoins {
		fmt.Fprintf(&b, "    %s\n", r)
	}
	fmt.Fprintf(&b, "  rolled-back events checked absent: %d\n", len(f.RolledBack))
	for _, n := range slices.Sorted(maps.Keys(f.Duplicates)) {
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
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		return s[min(len(s)-1, int(q*float64(len(s))))].Round(10 * time.Millisecond)
	}
	return at(0.5), at(0.95), s[len(s)-1].Round(10 * time.Millisecond)
}
