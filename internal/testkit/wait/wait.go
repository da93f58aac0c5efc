// Package wait is the tests' one way to wait for something to happen:
// poll a condition until it holds, with a deadline and a message that says
// what was awaited (and, with ForStatus, where things stood) when the
// deadline passes. A sleep that paces a fault or waits out a window in
// which nothing may happen is not a wait for a condition and stays a
// commented time.Sleep.
package wait

import (
	"testing"
	"time"
)

// Every is how often a condition is polled.
const Every = 10 * time.Millisecond

// For polls cond every Every until it holds, and fails t naming what once
// d has passed first.
func For(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ForStatus(t, d, what, func() (bool, string) { return cond(), "" })
}

// ForStatus is For with a condition that also describes the state it saw;
// the last description is part of the failure.
func ForStatus(t testing.TB, d time.Duration, what string, cond func() (ok bool, state string)) {
	t.Helper()
	if !Until(d, cond) {
		_, state := cond()
		if state != "" {
			state = "; last state: " + state
		}
		t.Fatalf("timed out after %s waiting for %s%s", d, what, state)
	}
}

// Until polls cond every Every until it holds (true) or d has passed
// (false), for a caller that fails in its own way.
func Until(d time.Duration, cond func() (ok bool, state string)) bool {
	return UntilEvery(d, Every, cond)
}

// UntilEvery is Until polling every every: for a benchmark whose
// condition is a costly read beside what it measures.
func UntilEvery(d, every time.Duration, cond func() (ok bool, state string)) bool {
	deadline := time.Now().Add(d)
	for {
		if ok, _ := cond(); ok {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every) // the polling interval, with the deadline above
	}
}
