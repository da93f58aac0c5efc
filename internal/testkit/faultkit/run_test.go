package faultkit

import (
	"testing"
	"time"

	"github.com/posthorn/posthorn/demo"
)

// TestStallWatch: the part that stops moving while work waits for it is
// named after stallAfter; a consumer waiting for the relays is not.
func TestStallWatch(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cases := []struct {
		name  string
		steps []demo.Progress
		want  string
	}{
		{"relay stuck, consumers caught up with what was relayed", []demo.Progress{
			{Events: 100, Unrelayed: 34, Applied: map[string]int64{"a": 66, "b": 66}},
			{Events: 100, Unrelayed: 34, Applied: map[string]int64{"a": 66, "b": 66}},
		}, relayWho},
		{"consumer b stuck behind relayed events", []demo.Progress{
			{Events: 100, Unrelayed: 0, Applied: map[string]int64{"a": 100, "b": 60}},
			{Events: 100, Unrelayed: 0, Applied: map[string]int64{"a": 100, "b": 60}},
		}, "b"},
		{"everything delivered", []demo.Progress{
			{Events: 100, Applied: map[string]int64{"a": 100, "b": 100}},
			{Events: 100, Applied: map[string]int64{"a": 100, "b": 100}},
		}, ""},
		{"moving", []demo.Progress{
			{Events: 100, Unrelayed: 50, Applied: map[string]int64{"a": 10, "b": 20}},
			{Events: 120, Unrelayed: 40, Applied: map[string]int64{"a": 11, "b": 21}},
		}, ""},
	}
	for _, c := range cases {
		var w stallWatch
		if got := w.check(c.steps[0], at(0)); got != "" {
			t.Fatalf("%s: stalled at once: %q", c.name, got)
		}
		if got := w.check(c.steps[1], at(stallAfter/2)); got != "" {
			t.Fatalf("%s: stalled before stallAfter: %q", c.name, got)
		}
		if got := w.check(c.steps[1], at(stallAfter+time.Second)); got != c.want {
			t.Fatalf("%s: stalled %q, want %q", c.name, got, c.want)
		}
	}
}
