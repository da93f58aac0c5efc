package bridge

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/internal/promset"
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
	heldByStandby  prometheus.Gauge
	standbyWait    prometheus.Histogram
	heldByHistory  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, sink string) (*metrics, error) {
	var s promset.Set
	m := &metrics{
		backlog:   s.Gauge("posthorn_outbox_backlog_events", "Outbox rows not yet relayed (parked aggregates included)."),
		oldestAge: s.Gauge("posthorn_outbox_oldest_unrelayed_age_seconds", "Age of the oldest outbox row not yet relayed."),
		published: s.CounterVec("posthorn_relay_published_total", "Records the sink acknowledged.", "sink").WithLabelValues(sink),
		publishSeconds: s.HistogramVec("posthorn_relay_publish_seconds", "Time from handing a batch to the sink to its ACK.",
			prometheus.ExponentialBuckets(0.0005, 2, 16), "sink").WithLabelValues(sink),
		batchSize: s.Histogram("posthorn_relay_batch_size", "Records per published batch.", prometheus.ExponentialBuckets(1, 4, 9)),
		retries:   s.Counter("posthorn_relay_retries_total", "Batches retried after a retryable sink failure."),
		takeovers: s.Counter("posthorn_relay_lease_takeovers_total", "Shard leases taken over from another relay whose lease had expired."),
		parked:    s.Gauge("posthorn_relay_parked_aggregates", "Aggregates parked because the sink rejected one of their records for good."),
		heldByOpenTx: s.Gauge("posthorn_relay_held_by_open_transaction_seconds",
			"Age of the oldest open transaction holding a transaction ID in the ledger database: how long not-yet-visible outbox rows may be held back."),
		fenced:      s.Counter("posthorn_relay_fenced_markers_total", "Markers refused because this relay's lease token was superseded."),
		abandoned:   s.Counter("posthorn_relay_abandoned_batches_total", "Batches read but not published because the lease would expire first."),
		shardsOwned: s.Gauge("posthorn_relay_shards_owned", "Outbox shards this relay holds a lease on."),
		heldByStandby: s.Gauge("posthorn_relay_held_by_standby_seconds",
			"How long the relay has been holding a batch back because the ledger's standbys have not flushed it (relay.standby_flush: required); 0 when not held."),
		standbyWait: s.Histogram("posthorn_relay_standby_wait_seconds", "Time a batch waited for the ledger's standbys to flush it (relay.standby_flush: required).",
			prometheus.ExponentialBuckets(0.0002, 2, 18)),
		heldByHistory: s.Gauge("posthorn_relay_held_by_ledger_history",
			"1 while the relay publishes nothing because the ledger runs on a history (system identifier, timeline) other than the accepted one: after a failover, until posthorn failover recover accepts it."),
	}
	return m, s.Register(reg)
}
