// Package relaymetrics holds the relay's Prometheus series, which the
// polling and the CDC relay both report through, so that the two modes
// publish the same names (contract.md) with the same meaning.
package relaymetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/promset"
)

// Metrics are the relay's Prometheus series (names fixed by contract.md),
// which both relay modes report through.
type Metrics struct {
	Backlog          prometheus.Gauge
	OldestAge        prometheus.Gauge
	PublishedTotal   prometheus.Counter
	PublishSeconds   prometheus.Observer
	BatchSize        prometheus.Histogram
	Retries          prometheus.Counter
	Takeovers        prometheus.Counter
	Parked           prometheus.Gauge
	HeldByOpenTx     prometheus.Gauge
	FencedMarkers    prometheus.Counter
	AbandonedBatches prometheus.Counter
	ShardsOwned      prometheus.Gauge
	HeldByStandby    prometheus.Gauge
	StandbyWait      prometheus.Histogram
	HeldByHistory    prometheus.Gauge
}

// New registers the relay's series on reg (nil: none) with the sink label
// sink.
func New(reg prometheus.Registerer, sink string) (*Metrics, error) {
	var s promset.Set
	m := &Metrics{
		Backlog:        s.Gauge("posthorn_outbox_backlog_events", "Outbox rows not yet relayed (parked aggregates included)."),
		OldestAge:      s.Gauge("posthorn_outbox_oldest_unrelayed_age_seconds", "Age of the oldest outbox row not yet relayed."),
		PublishedTotal: s.CounterVec("posthorn_relay_published_total", "Records the sink acknowledged.", "sink").WithLabelValues(sink),
		PublishSeconds: s.HistogramVec("posthorn_relay_publish_seconds", "Time from handing a batch to the sink to its ACK.",
			prometheus.ExponentialBuckets(0.0005, 2, 16), "sink").WithLabelValues(sink),
		BatchSize: s.Histogram("posthorn_relay_batch_size", "Records per published batch.", prometheus.ExponentialBuckets(1, 4, 9)),
		Retries:   s.Counter("posthorn_relay_retries_total", "Batches retried after a retryable sink failure."),
		Takeovers: s.Counter("posthorn_relay_lease_takeovers_total", "Shard leases taken over from another relay whose lease had expired."),
		Parked:    s.Gauge("posthorn_relay_parked_aggregates", "Aggregates parked because the sink rejected one of their records for good."),
		HeldByOpenTx: s.Gauge("posthorn_relay_held_by_open_transaction_seconds",
			"Age of the oldest open transaction holding a transaction ID in the ledger database: how long not-yet-visible outbox rows may be held back."),
		FencedMarkers:    s.Counter("posthorn_relay_fenced_markers_total", "Markers refused because this relay's lease token was superseded."),
		AbandonedBatches: s.Counter("posthorn_relay_abandoned_batches_total", "Batches read but not published because the lease would expire first."),
		ShardsOwned:      s.Gauge("posthorn_relay_shards_owned", "Outbox shards this relay holds a lease on."),
		HeldByStandby: s.Gauge("posthorn_relay_held_by_standby_seconds",
			"How long the relay has been holding a batch back because the ledger's standbys have not flushed it (relay.standby_flush: required); 0 when not held."),
		StandbyWait: s.Histogram("posthorn_relay_standby_wait_seconds", "Time a batch waited for the ledger's standbys to flush it (relay.standby_flush: required).",
			prometheus.ExponentialBuckets(0.0002, 2, 18)),
		HeldByHistory: s.Gauge("posthorn_relay_held_by_ledger_history",
			"1 while the relay publishes nothing because the ledger runs on a history (system identifier, timeline) other than the accepted one: after a failover, until posthorn failover recover accepts it."),
	}
	return m, s.Register(reg)
}

// Published observes one published batch: its size, the time to the sink's
// ACK and how many records the sink took.
func (m *Metrics) Published(size, acked int, took time.Duration) {
	m.PublishSeconds.Observe(took.Seconds())
	m.BatchSize.Observe(float64(size))
	m.PublishedTotal.Add(float64(acked))
}

// Retried counts a batch retried after a retryable sink failure.
func (m *Metrics) Retried() { m.Retries.Inc() }

// TookOver counts a lease taken over from a relay that stopped renewing.
func (m *Metrics) TookOver() { m.Takeovers.Inc() }

// Fenced counts markers refused because the lease was superseded.
func (m *Metrics) Fenced(n int) { m.FencedMarkers.Add(float64(n)) }

// Abandoned counts a batch not published because the lease would expire.
func (m *Metrics) Abandoned() { m.AbandonedBatches.Inc() }

// NewlyParked counts an aggregate parked now.
func (m *Metrics) NewlyParked() { m.Parked.Inc() }

// SetStatus sets the backlog, oldest-age and parked gauges from st.
func (m *Metrics) SetStatus(st core.OutboxStatus) {
	m.Backlog.Set(float64(st.Backlog))
	m.OldestAge.Set(st.OldestUnrelayedAge)
	m.Parked.Set(float64(len(st.Parked)))
}

// SetHeldByOpenTransaction sets the open-transaction gauge.
func (m *Metrics) SetHeldByOpenTransaction(d time.Duration) { m.HeldByOpenTx.Set(d.Seconds()) }

// StatsWait is how long a relay waits before it reads its gauges again:
// interval, or, when reading them took longer than a tenth of that, ten
// times as long as it took. The backlog query reads every pending row
// (about a second of database time per million), and at the default 2 s it
// slowed the drain of a 1M backlog by a quarter to a third.
func StatsWait(interval, took time.Duration) time.Duration { return max(interval, 10*took) }
