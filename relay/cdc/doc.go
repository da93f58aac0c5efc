// Package cdc is the relay's CDC mode (relay.mode: cdc): it streams the
// inserts into the outbox table through logical replication (pgoutput, a
// publication on the outbox table only) and publishes them to the same
// sinks, with the same batching, failure classification, parking, markers
// and metrics as the polling relay (relay/polling, its sibling; what both
// share is package relay's).
//
// # Confirm only what is durably delivered
//
// The server sends whole committed transactions in commit order (never a
// rolled-back one). Per account, commit order is revision order, because
// each outbox row is written under its account's row lock. The relay
// publishes the rows of received transactions in that order, waits for the
// sink's ACK, writes the marker (deletes the rows' outbox_pending entries,
// fenced by the slot lease), and only then confirms the last transaction's
// end LSN to the server (StandbyStatusUpdate). The slot's confirmed position therefore never
// passes a row that is not ACKed and marked (or parked): a crash anywhere
// repeats rows with the same event IDs, it never skips one. A restart
// resumes from the confirmed position. Hooks.AfterAck and Hooks.AfterMark
// are the injected crash points; Hooks.UnsafeConfirmOnReceipt is the
// negative control.
//
// A decoded transaction can reach the relay a moment before its rows are
// visible to other sessions (the commit record is flushed before the
// committing session leaves the proc array). The marker statement reports
// the ids it could not see and the relay marks them again until it can;
// a slot is only used once every transaction committed before its
// consistent point is visible. Confirming past an unmarked row, even
// briefly, would lose it for the stream.
//
// # The marker is kept
//
// Backlog metrics, reconciliation, cleanup and `posthorn outbox status`
// read the work queue outbox_pending, so the CDC relay writes the same
// marker as the polling relay; the outbox stays the record of what was
// delivered, and the slot is only a cheaper way to learn about new rows.
//
// # Start, first start and slot loss: catch up from the outbox
//
// Every session (start, restart, takeover) runs the same path:
//
//  1. If the slot is missing or invalidated (wal_status = lost, the server
//     removed WAL it needed because of max_slot_wal_keep_size), log an error
//     saying so, count posthorn_cdc_slot_recoveries_total{reason}, drop a
//     lost slot and create a new one. The slot is created FIRST: every
//     transaction that committed before its consistent point is visible to
//     any read after creation, and every later one is in its stream.
//  2. Catch up: read the unrelayed outbox rows (those still in outbox_pending, the
//     polling relay's read path, in id order, parked aggregates skipped) and
//     deliver them until one read saw them all. Rows not yet marked are
//     exactly what may be missing downstream, so the marker state is the
//     verified boundary to restart from; nothing earlier needs sending.
//  3. Stream. Transactions committed before the catch-up finished may be
//     streamed again; their rows are skipped when already marked (one
//     indexed lookup per batch, only for that stretch). The stretch ends at
//     the WAL insert position read after the catch-up, which is past the
//     commit of every transaction it could see even with synchronous_commit
//     off (the write position may not be yet, and the stream would send
//     those rows again as unmarked). A repeat is never a
//     reorder: catch-up sends per account in revision order, and the stream
//     only adds later revisions or already-sent ones.
//
// The first start on an existing backlog (e.g. switching from polling) is
// the same path. Hooks.SkipCatchUp is the negative control: without step 2
// rows committed while no slot existed are lost.
//
// # One reader per slot
//
// A relay streams only while it holds the slot's row in relay_cdc_leases
// (renewed every LeaseTTL/4; each grant takes a new fencing token). Other
// relays stand by and take over when the lease expires (a dead or stalled
// reader); a new holder ends a stalled holder's WAL sender. The stale
// holder cannot confirm (its stream is gone) and its markers are refused
// by the token; before each publish it checks that its lease outlives the
// publish, and abandons the batch otherwise.
//
// # Idle databases and WAL pressure
//
// A slot keeps WAL from its restart position on. When the outbox is quiet
// but other tables or databases write, the relay keeps the slot moving:
// with nothing in flight it confirms the server's WAL end from keepalives
// (every transaction committed before it was already sent), and every
// HeartbeatInterval it emits a tiny logical message
// (pg_logical_emit_message) so there is a position to confirm. The gauges
// posthorn_wal_slot_retained_bytes, posthorn_wal_slot_safe_wal_size_bytes,
// posthorn_wal_slot_status and posthorn_cdc_lag_seconds show the pressure;
// operators should set max_slot_wal_keep_size so a stuck slot cannot fill
// the disk — when it is hit the slot is invalidated and the relay recovers
// through the outbox as above.
//
// # Exactly once on the wire
//
// With Settings.ExactlyOnce the sink is a relay.FencedSink and every batch
// goes out as one transaction per shard (delivery.Fences). Each session
// starts by fencing all shards and marking what their newest committed
// transactions hold, before the outbox catch-up, so the catch-up and the
// stream's marker check skip every row already committed, whoever
// committed it. A transaction that fails (or whose outcome is unknown) ends
// the session instead of being retried in place: the next session fences
// first. Deliver marks before it goes on, so no marker is in flight when a
// transaction is built.
//
// # Standbys
//
// With Settings.StandbyFlush required (relay/internal/standbygate), the rows of
// received transactions are published only once enough of the ledger's
// physical standbys have flushed past the last one's commit (its end LSN
// from the stream; for a large transaction delivered before its end
// arrived, and for the outbox catch-up, the WAL insert position read before
// the wait). The slot lease is renewed and the server answered while the
// relay is held.
//
// # Parking
//
// A record the sink rejects for good parks its aggregate (relay_parked) as
// in the polling relay; the stream's later rows of that aggregate are not
// sent (their position is still confirmed: they stay unrelayed in the
// outbox). When an operator releases the aggregate, the relay runs the
// outbox catch-up again, which sends the held rows in order.
package cdc
