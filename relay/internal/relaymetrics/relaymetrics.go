// Package relaymetrics holds the relay's Prometheus series, which the
// polling and the CDC relay both report through, so that the two modes
// publish the same names (contract.md) with the same meaning.
package relaymetrics

import (
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/promset"
	"github.com/posthorn/posthorn/relay"
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
	RowsBelowMarks   prometheus.Counter
	ShardsOwned      prometheus.Gauge
	HeldByStandby    prometheus.Gauge
	StandbyWait      prometheus.Histogram
	HeldByHistory    prometheus.Gauge
	HorizonAge       prometheus.Gauge
	HorizonXIDAge    prometheus.Gauge
	HorizonHolder    *prometheus.GaugeVec

	horizon horizonWatch
}

// horizonWatch follows what holds the ledger's MVCC horizon between two
// reads of the gauges: since when this relay has seen a slot or a standby
// hold it (the server does not say), and when it last warned.
type horizonWatch struct {
	mu       sync.Mutex
	log      *slog.Logger
	key      string
	since    time.Time
	warnedAt time.Time
}

// HorizonWarnAge is how long something may hold the ledger's horizon before
// the relay warns (and the alert on posthorn_ledger_horizon_age_seconds
// fires): the tables that churn then keep that long's dead versions.
const HorizonWarnAge = 5 * time.Minute

// New registers the relay's series on reg (nil: none) with the sink label
// sink; log receives the warnings of a held horizon.
func New(reg prometheus.Registerer, sink string, log *slog.Logger) (*Metrics, error) {
	var s promset.Set
	m := &Metrics{
		horizon:        horizonWatch{log: log},
		Backlog:        s.Gauge("posthorn_outbox_backlog_events", "Outbox rows not yet relayed (parked aggregates included)."),
		OldestAge:      s.Gauge("posthorn_outbox_oldest_unrelayed_age_seconds", "Age of the first outbox row not yet relayed, in the order the relay reads (the oldest but for a transaction that took its id late)."),
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
		RowsBelowMarks: s.Counter("posthorn_relay_rows_below_marks_total",
			"Audits of the read's low-water marks that found committed rows below them (the marks were dropped and the rows are sent): a rule of the read broke; report it."),
		ShardsOwned: s.Gauge("posthorn_relay_shards_owned", "Outbox shards this relay holds a lease on."),
		HeldByStandby: s.Gauge("posthorn_relay_held_by_standby_seconds",
			"How long the relay has been holding a batch back because the ledger's standbys have not flushed it (relay.standby_flush: required); 0 when not held."),
		StandbyWait: s.Histogram("posthorn_relay_standby_wait_seconds", "Time a batch waited for the ledger's standbys to flush it (relay.standby_flush: required).",
			prometheus.ExponentialBuckets(0.0002, 2, 18)),
		HeldByHistory: s.Gauge("posthorn_relay_held_by_ledger_history",
			"1 while the relay publishes nothing because the ledger runs on a history (system identifier, timeline) other than the accepted one: after a failover, until posthorn failover recover accepts it."),
		HorizonAge: s.Gauge("posthorn_ledger_horizon_age_seconds",
			"How long what holds the ledger database's MVCC horizon back the furthest has held it (a session's or prepared transaction's age; for a slot or a standby, since this relay first saw it); 0 when nothing but running statements does."),
		HorizonXIDAge: s.Gauge("posthorn_ledger_horizon_xid_age",
			"How many transactions the ledger database's MVCC horizon is behind: the row versions of that many transactions cannot be vacuumed."),
		HorizonHolder: s.GaugeVec("posthorn_ledger_horizon_holder",
			"1 for what holds the ledger database's MVCC horizon back the furthest: kind (session, prepared, slot, standby) and holder (application name and pid, gid, slot name, standby's application name and pid).", "kind", "holder"),
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

// ReadFailed counts a read's error err that says an audit found rows below
// the read's marks (relay.ErrRowsBelowMarks).
func (m *Metrics) ReadFailed(err error) {
	if errors.Is(err, relay.ErrRowsBelowMarks) {
		m.RowsBelowMarks.Inc()
	}
}

// NewlyParked counts an aggregate parked now.
func (m *Metrics) NewlyParked() { m.Parked.Inc() }

// SetStatus sets the backlog, oldest-age, parked and horizon gauges from
// st.
func (m *Metrics) SetStatus(st core.OutboxStatus) {
	m.Backlog.Set(float64(st.Backlog))
	m.OldestAge.Set(st.OldestUnrelayedAge)
	m.Parked.Set(float64(len(st.Parked)))
	m.setHorizon(st.Horizon, time.Now())
}

// setHorizon sets the horizon gauges from h (nil: nothing holds it) and
// warns, at most once a minute, while it has been held past HorizonWarnAge.
func (m *Metrics) setHorizon(h *core.LedgerHorizon, now time.Time) {
	w := &m.horizon
	w.mu.Lock()
	defer w.mu.Unlock()
	m.HorizonHolder.Reset()
	if h == nil {
		w.key = ""
		m.HorizonAge.Set(0)
		m.HorizonXIDAge.Set(0)
		return
	}
	if key := h.Kind + "\x00" + h.Holder + "\x00" + strconv.FormatInt(h.Xmin, 10); key != w.key {
		w.key, w.since = key, now
	}
	age := h.AgeSeconds
	if age < 0 {
		age = now.Sub(w.since).Seconds()
	}
	m.HorizonAge.Set(age)
	m.HorizonXIDAge.Set(float64(h.XIDAge))
	m.HorizonHolder.WithLabelValues(h.Kind, h.Holder).Set(1)
	if age >= HorizonWarnAge.Seconds() && now.Sub(w.warnedAt) >= time.Minute && w.log != nil {
		w.warnedAt = now
		w.log.Warn("the ledger's MVCC horizon is held: rows deleted or updated since cannot be vacuumed (docs/operations.md, the ledger's horizon)",
			"kind", h.Kind, "holder", h.Holder, "state", h.State, "age", time.Duration(age*float64(time.Second)).Round(time.Second),
			"transactions_behind", h.XIDAge)
	}
}

// SetHeldByOpenTransaction sets the open-transaction gauge.
func (m *Metrics) SetHeldByOpenTransaction(d time.Duration) { m.HeldByOpenTx.Set(d.Seconds()) }

// StatsWait is how long a relay waits before it reads its gauges again:
// interval, or, when reading them took longer than a tenth of that, ten
// times as long as it took. The backlog query reads every pending row
// (about a second of database time per million), and at the default 2 s it
// slowed the drain of a 1M backlog by a quarter to a third.
func StatsWait(interval, took time.Duration) time.Duration { return max(interval, 10*took) }
