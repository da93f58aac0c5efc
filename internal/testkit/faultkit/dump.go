package faultkit

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// LastRun returns what the process wrote to the log at path since its last
// start (the log is appended across restarts).
func LastRun(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	starts := startMarker.FindAllIndex(data, -1)
	if len(starts) == 0 {
		return string(data)
	}
	return string(data[starts[len(starts)-1][0]:])
}

var (
	startMarker     = regexp.MustCompile(`(?m)^==== \S+ start \d+ at (\S+)`)
	goroutineHeader = regexp.MustCompile(`^goroutine \d+ (?:gp=\S+ m=\S+ (?:mp=\S+ )?)?\[(.*)\]:$`)
	pcOffset        = regexp.MustCompile(`(?: \+0x[0-9a-f]+)?(?: fp=\S+ sp=\S+ pc=\S+)?$`)
	callArgs        = regexp.MustCompile(`\([^()]*\)$`)
	inGoroutine     = regexp.MustCompile(` in goroutine \d+$`)
)

// SummarizeDump condenses the goroutine dump in text (a Go program's
// output on SIGQUIT) to its distinct stacks, most common first, each with
// how many goroutines share it and their states (a wait's length, e.g.
// "chan receive, 3 minutes", is what points at a hang). Arguments, program
// counters and the scheduler's own frames are left out, so that goroutines
// parked at the same place fold into one stack. Text without a dump is
// returned as "no goroutine dump".
func SummarizeDump(text string) string {
	type group struct {
		n      int
		states map[string]bool
		stack  string
	}
	groups := map[string]*group{}
	var order []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := goroutineHeader.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		var frames []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			if strings.HasPrefix(lines[i], "runtime.") {
				i++ // the scheduler's own frames and their file line say nothing of the hang
				continue
			}
			l := pcOffset.ReplaceAllString(lines[i], "")
			l = inGoroutine.ReplaceAllString(l, "")
			if !strings.HasPrefix(l, "\t") {
				l = callArgs.ReplaceAllString(l, "(…)")
			}
			frames = append(frames, l)
		}
		stack := strings.Join(frames, "\n")
		g := groups[stack]
		if g == nil {
			g = &group{states: map[string]bool{}, stack: stack}
			groups[stack] = g
			order = append(order, stack)
		}
		g.n++
		g.states[m[1]] = true
	}
	if len(order) == 0 {
		return "no goroutine dump"
	}
	sort.SliceStable(order, func(i, j int) bool { return groups[order[i]].n > groups[order[j]].n })
	var b strings.Builder
	for _, k := range order {
		g := groups[k]
		states := make([]string, 0, len(g.states))
		for s := range g.states {
			states = append(states, s)
		}
		sort.Strings(states)
		fmt.Fprintf(&b, "%d goroutine(s) [%s]:\n%s\n\n", g.n, strings.Join(states, "; "), g.stack)
	}
	return b.String()
}
