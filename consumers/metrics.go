package consumers

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/promset"
)

// metrics are shared by every consumer registered on one Prometheus
// registerer; the consumer label tells them apart.
type metrics struct {
	messages   *prometheus.CounterVec
	gaps       *prometheus.CounterVec
	dupRatio   *prometheus.GaugeVec
	parked     *prometheus.GaugeVec
	held       *prometheus.GaugeVec
	handlerDur *prometheus.HistogramVec
	lag        *prometheus.GaugeVec

	mu     sync.Mutex
	totals map[string]*ratio
}

type ratio struct{ dup, all float64 }

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "posthorn_consumer_messages_total",
			Help: "Dispositions recorded, by consumer and disposition (applied, duplicate, parked_gap, parked_poison, rejected, revision_conflict, skipped).",
		}, []string{"consumer", "disposition"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "posthorn_consumer_revision_gaps_total",
			Help: "Events received ahead of their predecessor (held in the inbox).",
		}, []string{"consumer"}),
		dupRatio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "posthorn_consumer_duplicate_ratio",
			Help: "Share of deliveries absorbed as duplicates since the process started.",
		}, []string{"consumer"}),
		parked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "posthorn_consumer_parked_aggregates",
			Help: "Aggregates (accounts) parked by a revision gap or a poison event, waiting for release.",
		}, []string{"consumer"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "posthorn_consumer_held_events",
			Help: "Events held in the inbox waiting for their predecessor, inside the hold time.",
		}, []string{"consumer"}),
		handlerDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "posthorn_consumer_handler_seconds",
			Help:    "Time to apply one event: the handler and its inbox transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"consumer"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "posthorn_consumer_lag_seconds",
			Help: "Age of the last event handled (now minus its occurred_at header).",
		}, []string{"consumer"}),
		totals: make(map[string]*ratio),
	}
	m.messages = register(reg, m.messages)
	m.gaps = register(reg, m.gaps)
	m.dupRatio = register(reg, m.dupRatio)
	m.parked = register(reg, m.parked)
	m.held = register(reg, m.held)
	m.handlerDur = register(reg, m.handlerDur)
	m.lag = register(reg, m.lag)
	return m
}

// register registers c, or takes the collector already registered under
// its name (promset.Register), so that several registries (two instances in
// one process, as in tests) can share one Prometheus registerer.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	c, err := promset.Register(reg, c)
	if err != nil {
		panic(err) // a programming error: a clashing metric name
	}
	return c
}

// init makes every disposition of consumer visible at zero, so rates and
// alerts work before the first event.
func (m *metrics) init(consumer string) {
	for _, d := range []core.Disposition{core.DispositionApplied, core.DispositionDuplicate,
		core.DispositionParkedGap, core.DispositionParkedPoison, core.DispositionRejected, core.DispositionRevisionConflict, core.DispositionSkipped} {
		m.messages.WithLabelValues(consumer, string(d))
	}
	m.gaps.WithLabelValues(consumer)
	m.parked.WithLabelValues(consumer)
	m.held.WithLabelValues(consumer)
	m.dupRatio.WithLabelValues(consumer)
}

func (m *metrics) record(consumer string, d core.Disposition, n int) {
	var counts [dispositionCount]int
	counts[dispositionIndex(d)] = n
	m.recordAll(consumer, &counts)
}

// dispositions are the dispositions counted, by index; dispositionCount
// is one more, for a disposition outside them (never counted).
var dispositions = [...]core.Disposition{core.DispositionApplied, core.DispositionDuplicate, core.DispositionParkedGap,
	core.DispositionParkedPoison, core.DispositionRejected, core.DispositionRevisionConflict, core.DispositionSkipped}

const dispositionCount = len(dispositions) + 1

func dispositionIndex(d core.Disposition) int {
	for i, x := range dispositions {
		if x == d {
			return i
		}
	}
	return len(dispositions)
}

// recordAll counts a batch's dispositions (counts by dispositionIndex) at
// once: a counter's labels are looked up once per disposition a batch had,
// not per event.
func (m *metrics) recordAll(consumer string, counts *[dispositionCount]int) {
	var all, dup int
	for i, d := range dispositions {
		if counts[i] == 0 {
			continue
		}
		m.messages.WithLabelValues(consumer, string(d)).Add(float64(counts[i]))
		all += counts[i]
		if d == core.DispositionDuplicate {
			dup += counts[i]
		}
	}
	if all == 0 {
		return
	}
	m.mu.Lock()
	r := m.totals[consumer]
	if r == nil {
		r = &ratio{}
		m.totals[consumer] = r
	}
	r.all += float64(all)
	r.dup += float64(dup)
	v := r.dup / r.all
	m.mu.Unlock()
	m.dupRatio.WithLabelValues(consumer).Set(v)
}

// applyMetrics are one consumer's apply latency and lag, their labels
// looked up once.
type applyMetrics struct {
	handler prometheus.Observer
	lag     prometheus.Gauge
}

func (m *metrics) applyOf(consumer string) applyMetrics {
	return applyMetrics{handler: m.handlerDur.WithLabelValues(consumer), lag: m.lag.WithLabelValues(consumer)}
}

// observe records one apply that took took, of an event that occurred at
// occurredAt (the zero time: unknown, the lag stays as it was).
func (a applyMetrics) observe(took time.Duration, occurredAt time.Time) {
	a.handler.Observe(took.Seconds())
	if !occurredAt.IsZero() {
		a.lag.Set(time.Since(occurredAt).Seconds())
	}
}
