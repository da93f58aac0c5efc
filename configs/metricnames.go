package configs

// ContractMetrics are the Prometheus metric names of the outside contract
// (docs: contract, "Metrics"). The alert rules in configs/prometheus and the
// dashboard in configs/grafana use only these, and a running relay and
// consumer must expose them; renaming one breaks operators' alerts, so keep
// the old name exported too.
var ContractMetrics = []string{
	"posthorn_outbox_backlog_events",
	"posthorn_outbox_oldest_unrelayed_age_seconds",
	"posthorn_relay_published_total",
	"posthorn_relay_publish_seconds",
	"posthorn_relay_lease_takeovers_total",
	"posthorn_relay_parked_aggregates",
	"posthorn_relay_held_by_open_transaction_seconds",
	"posthorn_relay_open_transaction_age_seconds",
	"posthorn_wal_slot_retained_bytes",
	"posthorn_consumer_messages_total",
	"posthorn_consumer_revision_gaps_total",
}

// ContractHistograms are the ContractMetrics that are histograms, exposed
// as NAME_bucket, NAME_sum and NAME_count series.
var ContractHistograms = []string{
	"posthorn_relay_publish_seconds",
}

// OperatorMetrics are metrics beyond the contract's table that the alert
// rules and the dashboard also rely on (a stalled consumer, a
// lost CDC slot, parked and held accounts). Relay and consumers expose
// them under these names; keep them stable like the contract's.
var OperatorMetrics = []string{
	"posthorn_consumer_parked_aggregates",
	"posthorn_consumer_held_events",
	"posthorn_wal_slot_status",
	"posthorn_cdc_slot_recoveries_total",
	"posthorn_relay_held_by_standby_seconds",
	"posthorn_relay_held_by_ledger_history",
	"posthorn_relay_rows_below_marks_total",
	"posthorn_cdc_published_past_branch_point_total",
	"posthorn_ledger_horizon_age_seconds",
}
