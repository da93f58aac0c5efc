package console

import (
	"testing"
	"time"
)

// The plots' rates are per second between neighbouring samples, lag is the
// relayed events a consumer has not recorded, and samples older than the
// window are dropped.
func TestSeriesRatesLagAndWindow(t *testing.T) {
	t.Parallel()
	c := &Console{cfg: Config{SampleEvery: 2 * time.Second}, consumers: []string{"a"}, history: history{window: time.Minute}}
	t0 := time.Unix(1_800_000_000, 0)
	c.history.add(sample{at: t0, written: 10, relayed: 6, backlog: 4, consumerRelayed: []int64{6}, consumerApplied: []int64{5}, consumerSeen: []int64{5}, consumerDups: []int64{0}})
	c.history.add(sample{at: t0.Add(2 * time.Second), written: 30, relayed: 28, backlog: 2, consumerRelayed: []int64{28}, consumerApplied: []int64{25}, consumerSeen: []int64{26}, consumerDups: []int64{4}})
	s := c.series()
	if len(s.Time) != 2 || s.WriteRate[0] != nil || s.PublishRate[0] != nil {
		t.Fatalf("first sample: %+v", s)
	}
	// relayed 6 → 28 in 2s; applied 5 → 25; duplicates 0 → 4.
	if *s.WriteRate[1] != 10 || *s.PublishRate[1] != 11 || *s.AppliedRate[0][1] != 10 || *s.DuplicatesRate[0][1] != 2 {
		t.Fatalf("rates: write %v publish %v applied %v dups %v", *s.WriteRate[1], *s.PublishRate[1], *s.AppliedRate[0][1], *s.DuplicatesRate[0][1])
	}
	if s.Lag[0][0] != 1 || s.Lag[0][1] != 2 {
		t.Fatalf("lag %v, want [1 2]", s.Lag[0])
	}
	c.history.add(sample{at: t0.Add(61 * time.Second), written: 30, relayed: 30, consumerRelayed: []int64{30}, consumerApplied: []int64{30}, consumerSeen: []int64{30}, consumerDups: []int64{4}})
	if s := c.series(); len(s.Time) != 2 || s.Time[0] != float64(t0.Add(2*time.Second).Unix()) {
		t.Fatalf("after a minute the first sample should be gone: %v", s.Time)
	}
}
