package bridge

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus series (names fixed by contract.md).
type metrics struct {
	backlog        prometheus.Gauge
	oldestAge      prometheus.Gauge
	published      prometheus.Counter
	publishSeconds prometheus.Observer
	batchSize      prometheus.Histogram
	retries        prometheus.Counter
	takeovers      prometheus.Counter
	parked         prometheus.Gauge
	heldByOpenTx   prometheus.Gauge
	fenced         prometheus.Counter
	abandoned      prometheus.Counter
	shardsOwned    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, sink string) (*metrics, error) {
	published := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "posthorn_relay_published_total",
		Help: "Records the sink acknowledged.",
	}, []string{"sink"})
	publishSeconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "posthorn_relay_publish_seconds",
		Help:    "Time from handing a batch to the sink to its ACK.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"sink"})
	m := &metrics{
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "posthorn_outbox_backlog_events",
			Help: "Outbox rows not yet relayed (parked aggregates included).",
		}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "posthorn_outbox_oldest_unrelayed_age_seconds",
			Help: "Age of the oldest outbox row not yet relayed.",
		}),
		published:      published.WithLabelValues(sink),
		publishSeconds: publishSeconds.WithLabelValues(sink),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "posthorn_relay_batch_size",
			Help:    "Records per published batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "posthorn_relay_retries_total",
			Help: "Batches retried after a retryable sink failure.",
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "posthorn_relay_lease_takeovers_total",
			Help: "Shard leases taken over from another relay whose lease had expired.",
		}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "posthorn_relay_parked_aggregates",
			Help: "Aggregates parked because the sink rejected one of their records for good.",
		}),
		heldByOpenTx: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "posthorn_relay_held_by_open_transaction_seconds",
			Help: "Age of the oldest open transaction holding a transaction ID in the ledger database: how long not-yet-visible outbox rows may be held back.",
		}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "posthorn_relay_fenced_markers_total",
			Help: "Markers refused because this relay's lease token was superseded.",
		}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "posthorn_relay_abandoned_batches_total",
			Help: "Batches read but not published because the lease would expire first.",
		}),
		shardsOwned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "posthorn_relay_shards_owned",
			Help: "Outbox shards this relay holds a lease on.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.backlog, m.oldestAge, published, publishSeconds, m.batchSize,
		m.retries, m.takeovers, m.parked, m.heldByOpenTx, m.fenced, m.abandoned, m.shardsOwned} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
