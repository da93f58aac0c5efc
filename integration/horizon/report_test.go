package horizon_test

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// report prints the runs side by side as Markdown tables docs/measured.md
// can take: one row per window, one column per run, then the ratios.
func report(w io.Writer, cfg config, builds []build, runs []runResult) {
	_, held, _ := cfg.windows()
	fmt.Fprintf(w, "\nlong snapshot: %s events/s asked through posthorn_publish (%d publishers; half of the events on %d hot aggregates, half on %s cold ones), "+
		"%s postings/s asked through posthorn api (%d clients; each posting debits one of %d hot accounts); a REPEATABLE READ snapshot held %s "+
		"(%d windows of %s) after %s of calm, then %s of calm; builds: old = %s, new = %s\n",
		thousands(int64(cfg.rate)), publishers, hotAggregates, thousands(coldAggregates), thousands(int64(cfg.apiRate)), apiClients, hotAccounts,
		cfg.snapshot, held, cfg.window, cfg.calm, cfg.calm, builds[0].rev, builds[1].rev)

	table(w, "Latency, the event's occurred_at to its Kafka record's timestamp: p50 / p99 ms (events in the window)", runs,
		func(f windowFigures) string {
			return fmt.Sprintf("%s / %s (%s)", ms(f.p50), ms(f.p99), thousands(int64(f.events)))
		})
	table(w, fmt.Sprintf("Rates reached (asked: %d events/s, %d postings/s): publishers events/s (p99 of a call, ms) · API postings/s (p99 of a request, ms)",
		cfg.rate, cfg.apiRate), runs, func(f windowFigures) string {
		s := fmt.Sprintf("%.0f (%s) · %.0f (%s)", f.pubRate, ms(f.pubP99), f.apiRate, ms(f.apiP99))
		if f.failed > 0 {
			s += fmt.Sprintf(", %d failed", f.failed)
		}
		return s
	})
	table(w, "The work queue: dead entries of outbox_pending at the window's end · per call of the relay's statements on it, mean ms and buffers: "+
		"the polling read (calls) · the backlog gauge (calls) · the marker", runs,
		func(f windowFigures) string {
			return fmt.Sprintf("%s · %s · %s · %s", thousands(f.dead), perCall(f.read, true), perCall(f.gauge, true), perCall(f.mark, false))
		})
	table(w, "CPU, in cores: the relay process · the database's processes", runs, func(f windowFigures) string {
		return fmt.Sprintf("%.2f · %.2f", f.relay, f.db)
	})

	fmt.Fprintf(w, "\nRatios, new ÷ old, in the snapshot's last window:\n\n| mode | p50 | p99 | publishers' rate | API's rate | dead entries | read buffers per call | gauge buffers per call |\n|---|---|---|---|---|---|---|---|\n")
	for i := 0; i+1 < len(runs); i += 2 {
		o, n := runs[i].lastHeld(), runs[i+1].lastHeld()
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", runs[i].mode,
			ratio(float64(n.p50), float64(o.p50)), ratio(float64(n.p99), float64(o.p99)), ratio(n.pubRate, o.pubRate), ratio(n.apiRate, o.apiRate),
			ratio(float64(n.dead), float64(o.dead)), ratio(n.read.perCall(), o.read.perCall()), ratio(n.gauge.perCall(), o.gauge.perCall()))
	}
	fmt.Fprintf(w, "\nGrowth over the snapshot, its last window ÷ the last window before it:\n\n| run | p50 | p99 | publishers' rate | API's rate | read buffers per call | gauge buffers per call | database CPU |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		b, e := r.lastBefore(), r.lastHeld()
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.name(), ratio(float64(e.p50), float64(b.p50)), ratio(float64(e.p99), float64(b.p99)),
			ratio(e.pubRate, b.pubRate), ratio(e.apiRate, b.apiRate), ratio(e.read.perCall(), b.read.perCall()), ratio(e.gauge.perCall(), b.gauge.perCall()),
			ratio(e.db, b.db))
	}
	for _, r := range runs {
		if r.repeats > 0 {
			fmt.Fprintf(w, "\n%s: %d records read again (same event ID)\n", r.name(), r.repeats)
		}
	}
}

func table(w io.Writer, title string, runs []runResult, cell func(windowFigures) string) {
	fmt.Fprintf(w, "\n%s:\n\n| window |", title)
	for _, r := range runs {
		fmt.Fprintf(w, " %s |", r.name())
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(runs)))
	for k := range runs[0].windows {
		fmt.Fprintf(w, "| %s |", runs[0].windows[k].label)
		for _, r := range runs {
			fmt.Fprintf(w, " %s |", cell(r.windows[k]))
		}
		fmt.Fprintln(w)
	}
}

// lastHeld is the last window the snapshot was open in; lastBefore the
// last window before it opened.
func (r runResult) lastHeld() windowFigures {
	var last windowFigures
	for _, f := range r.windows {
		if f.snapshotOpen {
			last = f
		}
	}
	return last
}

func (r runResult) lastBefore() windowFigures {
	for i, f := range r.windows {
		if f.snapshotOpen {
			return r.windows[max(i-1, 0)]
		}
	}
	return r.windows[0]
}

func perCall(s stmtStats, withCalls bool) string {
	if s.calls == 0 {
		return "–"
	}
	out := fmt.Sprintf("%.2f ms, %.0f", s.meanMS(), s.perCall())
	if withCalls {
		out += fmt.Sprintf(" (%s)", thousands(s.calls))
	}
	return out
}

func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// thousands writes n with comma separators, as docs/measured.md does.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
