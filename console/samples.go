package console

import (
	"context"
	"sync"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// sample is one reading of the counters the plots are drawn from.
type sample struct {
	at        time.Time
	backlog   int64
	oldestAge float64 // seconds
	written   int64   // outbox rows
	relayed   int64   // outbox rows with their relay marker
	// Per consumer, in Config.Consumers order:
	consumerRelayed []int64 // relayed rows on the consumer's topics
	consumerApplied []int64
	consumerSeen    []int64 // event IDs with any disposition
	consumerDups    []int64 // duplicates absorbed
}

// lag is what consumer k has still to receive: the relayed events on its
// topics it has no disposition for. It counts events, as
// posthorn_consumer_offset_lag counts records: both are 0 once everything
// relayed is recorded.
func (s sample) lag(k int) int64 { return max(0, s.consumerRelayed[k]-s.consumerSeen[k]) }

// topicsOf returns the topics consumer source s reads: its own, or the
// ledger's events topic when it names none (as reconcile routes them).
func topicsOf(s ops.ConsumerSource) []string {
	if len(s.Topics) == 0 {
		return []string{core.TopicEvents}
	}
	return s.Topics
}

// history keeps the samples of the last window, oldest first. The console
// keeps its own so the plots need no Prometheus.
type history struct {
	mu      sync.Mutex
	window  time.Duration
	samples []sample
}

func (h *history) add(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples = append(h.samples, s)
	cut := 0
	for cut < len(h.samples) && s.at.Sub(h.samples[cut].at) > h.window {
		cut++
	}
	// Reslicing alone would keep the dropped samples' array for ever.
	if cut > 0 {
		h.samples = append(h.samples[:0:0], h.samples[cut:]...)
	}
}

func (h *history) snapshot() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sample(nil), h.samples...)
}

// take reads one sample: the same reads as `posthorn outbox status` and
// `posthorn consume status`.
func (c *Console) take(ctx context.Context) (sample, error) {
	s := sample{at: time.Now()}
	st, err := c.cfg.Store.OutboxStatus(ctx)
	if err != nil {
		return s, err
	}
	s.backlog, s.oldestAge = st.Backlog, st.OldestUnrelayedAge
	topics, err := c.cfg.Store.OutboxTopics(ctx)
	if err != nil {
		return s, err
	}
	relayed := map[string]int64{}
	for _, t := range topics {
		s.written += t.Written
		s.relayed += t.Relayed
		relayed[t.Topic] += t.Relayed
	}
	for i, name := range c.consumers {
		cs, err := c.cfg.Store.Consumer(ctx, name, 0)
		if err != nil {
			return s, err
		}
		var r int64
		for _, t := range topicsOf(c.cfg.Consumers[i]) {
			r += relayed[t]
		}
		s.consumerRelayed = append(s.consumerRelayed, r)
		s.consumerApplied = append(s.consumerApplied, cs.Events[core.DispositionApplied])
		s.consumerSeen = append(s.consumerSeen, cs.Recorded())
		s.consumerDups = append(s.consumerDups, cs.DuplicatesAbsorbed)
	}
	return s, nil
}

// sample reads every SampleEvery until ctx ends. A failed read is logged
// and leaves a gap in the plots rather than stopping the console.
func (c *Console) sample(ctx context.Context) {
	t := time.NewTicker(c.cfg.SampleEvery)
	defer t.Stop()
	for {
		s, err := c.take(ctx)
		switch {
		case err == nil:
			c.history.add(s)
		case ctx.Err() == nil:
			c.log.Warn("console: reading a sample failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Series are the plots' data as uPlot takes it: one x array (Unix
// seconds) and one array per series, null where a value is undefined (the
// first sample has no rate).
type Series struct {
	Time            []float64    `json:"time"`
	Backlog         []float64    `json:"backlog"`
	OldestAge       []float64    `json:"oldest_age_seconds"`
	WriteRate       []*float64   `json:"write_rate"`
	PublishRate     []*float64   `json:"publish_rate"`
	Consumers       []string     `json:"consumers"`
	AppliedRate     [][]*float64 `json:"applied_rate"`
	Lag             [][]float64  `json:"lag"`
	DuplicatesRate  [][]*float64 `json:"duplicates_rate"`
	SampleEverySecs float64      `json:"sample_every_seconds"`
}

// series turns the samples into rates per second between neighbours.
func (c *Console) series() Series {
	ss := c.history.snapshot()
	n := len(c.consumers)
	out := Series{Consumers: c.consumers, AppliedRate: make([][]*float64, n), Lag: make([][]float64, n),
		DuplicatesRate: make([][]*float64, n), SampleEverySecs: c.cfg.SampleEvery.Seconds()}
	rate := func(i int, v func(sample) int64) *float64 {
		if i == 0 {
			return nil
		}
		dt := ss[i].at.Sub(ss[i-1].at).Seconds()
		r := max(0, float64(v(ss[i])-v(ss[i-1]))/dt)
		return &r
	}
	for i, s := range ss {
		out.Time = append(out.Time, float64(s.at.UnixMilli())/1000)
		out.Backlog = append(out.Backlog, float64(s.backlog))
		out.OldestAge = append(out.OldestAge, s.oldestAge)
		out.WriteRate = append(out.WriteRate, rate(i, func(s sample) int64 { return s.written }))
		out.PublishRate = append(out.PublishRate, rate(i, func(s sample) int64 { return s.relayed }))
		for k := range n {
			out.AppliedRate[k] = append(out.AppliedRate[k], rate(i, func(s sample) int64 { return s.consumerApplied[k] }))
			out.DuplicatesRate[k] = append(out.DuplicatesRate[k], rate(i, func(s sample) int64 { return s.consumerDups[k] }))
			out.Lag[k] = append(out.Lag[k], float64(s.lag(k)))
		}
	}
	return out
}
