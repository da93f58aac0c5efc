package cdc

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/internal/promset"
)

// walStatuses are the values of pg_replication_slots.wal_status, plus
// "missing" for a slot that does not exist.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost", "missing"}

// metrics are the CDC-only series; the relay's common ones (published,
// latency, backlog, takeovers, …) come from relay/internal/relaymetrics.
type metrics struct {
	retained     prometheus.Gauge
	safe         prometheus.Gauge
	unconfirmed  prometheus.Gauge
	status       *prometheus.GaugeVec
	lag          prometheus.Gauge
	recoveries   *prometheus.CounterVec
	heartbeats   prometheus.Counter
	reader       prometheus.Gauge
	caughtUp     prometheus.Counter
	skippedMarks prometheus.Counter
	pastBranch   prometheus.Counter
	slot         string
}

func newMetrics(reg prometheus.Registerer, slot string) (*metrics, error) {
	s := promset.Set{ConstLabels: prometheus.Labels{"slot": slot}}
	m := &metrics{
		slot:     slot,
		retained: s.Gauge("posthorn_wal_slot_retained_bytes", "WAL the replication slot keeps on disk: pg_current_wal_lsn() - restart_lsn."),
		safe: s.Gauge("posthorn_wal_slot_safe_wal_size_bytes",
			"WAL that can still be written before the slot is in danger of being lost (pg_replication_slots.safe_wal_size); -1 when max_slot_wal_keep_size is unlimited."),
		unconfirmed: s.Gauge("posthorn_wal_slot_unconfirmed_bytes",
			"WAL written since the slot's confirmed position: pg_current_wal_lsn() - confirmed_flush_lsn."),
		status: s.GaugeVec("posthorn_wal_slot_status",
			"1 for the slot's current wal_status (reserved, extended, unreserved, lost) or missing.", "status"),
		lag: s.Gauge("posthorn_cdc_lag_seconds",
			"Age (from its commit) of the oldest transaction received from the slot and not yet confirmed; 0 when caught up."),
		recoveries: s.CounterVec("posthorn_cdc_slot_recoveries_total",
			"Times the slot was found missing or invalidated and coverage was restored from the outbox.", "reason"),
		heartbeats: s.Counter("posthorn_cdc_heartbeats_total", "Heartbeat messages emitted on an idle database so the slot can advance."),
		reader:     s.Gauge("posthorn_cdc_reader", "1 while this relay holds the slot's lease and streams it, 0 while it stands by."),
		caughtUp: s.Counter("posthorn_cdc_catchup_events_total",
			"Events sent from the outbox (not the stream) at start, after a slot loss or a release."),
		skippedMarks: s.Counter("posthorn_cdc_skipped_marked_total",
			"Streamed rows not sent again because the outbox catch-up had already sent and marked them."),
		pastBranch: s.Counter("posthorn_cdc_published_past_branch_point_total",
			"Events this relay published on a timeline past the point where the ledger's new history (after a failover) branched off: on the wire, not in the ledger."),
	}
	for _, r := range []string{"missing", "lost"} {
		m.recoveries.WithLabelValues(r)
	}
	return m, s.Register(reg)
}

func (m *metrics) setSlot(st SlotStatus) {
	cur := "missing"
	if st.Exists {
		cur = st.WALStatus
	}
	for _, s := range walStatuses {
		v := 0.0
		if s == cur {
			v = 1
		}
		m.status.WithLabelValues(s).Set(v)
	}
	if !st.Exists {
		return
	}
	m.retained.Set(float64(st.RetainedBytes))
	m.unconfirmed.Set(float64(st.UnconfirmedBytes))
	if st.SafeWALSize != nil {
		m.safe.Set(float64(*st.SafeWALSize))
	} else {
		m.safe.Set(-1)
	}
}
