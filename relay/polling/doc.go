// Package polling is the relay's polling mode (relay.mode: polling, the
// default): it moves the ledger's outbox to a sink (Kafka, the in-memory
// broker, any Watermill publisher) with leased shards, batched reads, ACK
// then marker, per-account order, retries and parking. Its settings, and
// what it shares with the CDC mode (relay/cdc, its sibling), are package
// relay's.
//
// # Ordering: no cursor, id order, no fence
//
// The write path inserts every outbox row after taking its account's row
// lock in the same transaction. Hence, per account, outbox id order is
// revision order, and a row becomes visible only after all its predecessors
// are visible (the predecessor's transaction committed before the lock was
// granted). The relay therefore reads the UNRELAYED rows of its shards (those
// still in the work queue outbox_pending (shard, id), which a trigger fills
// on every outbox insert) in id order, in one round trip for all owned
// shards, and never keeps a "last position" cursor:
//
//   - A transaction that commits late is never skipped: there is no cursor
//     to move past its row; the row is simply not visible yet, and the next
//     read after the commit finds it (trap 1 of a polling relay). The
//     cursor reading exists only as the negative control of that test
//     (Hooks.UnsafeCursor).
//   - Order never inverts: a transaction that took its transaction ID early
//     (on account B) and then waited for account A commits A's revision r+1
//     with a smaller transaction ID than revision r; ordering by transaction
//     ID would send r+1 first (trap 2). Id order follows the lock, so r
//     comes first. The store keeps an xid-ordered read only as the negative
//     control of that test (Hooks.UnsafeOrderByXID).
//   - Unlike Watermill's xmin fence, an unrelated open transaction does not
//     stall the relay. The gauge posthorn_relay_held_by_open_transaction_seconds
//     reports the age of the oldest open transaction in the ledger database
//     that holds a transaction ID (the relay's own sessions excluded), which
//     bounds how long not-yet-visible outbox rows can be held back, so an
//     operator sees a stall instead of guessing.
//
// No lock and no transaction is held while publishing: a read is one
// statement, the marker another.
//
// # ACK then marker
//
// A batch is published and the sink's ACK (every record durably taken, by
// the sink's own definition) is awaited before the marker (the deletion of
// the rows' outbox_pending entries) is written. A crash between the two only
// repeats records, with the same event IDs, which the consumers' inbox
// absorbs; the reverse order would lose a record when the crash falls
// between marker and send. Hooks.AfterAck is the injected crash point the
// tests use.
//
// To keep the sink busy, three steps overlap: while batch N is published,
// batch N+1 is read, and the marker of batch N-1 is written. The read skips
// the rows of N and of the marker in flight, so nothing is read twice; N+1
// is published only after N was ACKed in full under unchanged leases (else
// it is dropped and read again), so neither order nor "marker after ACK"
// changes. The marker is a delete of narrow queue rows, not an update of
// the outbox row: it writes no new row version and no index entry, which
// made it about ten times cheaper than the first design's UPDATE of
// relayed_at (see migration 00005).
//
// # Leases and fencing
//
// The outbox has core.Shards shards (by account). A relay heartbeats in
// relay_members, takes about its share (shards / live relays) of the
// relay_leases rows, each grant with a new fencing token from a sequence,
// and renews them every LeaseTTL/4. Before publishing it checks that the
// leases outlive the publish (the publish context's deadline is the lease
// expiry); a relay that was stalled (SIGSTOP, GC, a long pause) abandons
// its batch instead of publishing it late. The marker is written only for
// rows whose shard lease still carries this relay's token, so a stale
// owner's markers are refused and counted. Expiry may cause a repeat,
// which is fine: the event ID is the same. A relay that finds an expired
// lease of another relay takes it over and counts it.
//
// # Failures
//
// Sink errors are classified by core.IsPermanent alone. Retryable errors
// (a broker outage) back off exponentially with jitter and retry forever:
// the backlog grows, nothing is lost, delivery resumes by itself. On a
// *core.BatchError the relay marks only the records with no failed
// predecessor of the same aggregate in the batch; an aggregate whose record
// failed permanently is parked (relay_parked; a metric, a log line,
// `posthorn outbox status`) and its later rows are not read until an
// operator releases it, while every other aggregate keeps flowing.
//
// # Exactly once on the wire
//
// With Settings.ExactlyOnce the sink is a relay.FencedSink (the Kafka sink's
// exactly-once mode) and the relay keeps three more rules:
//
//   - Fence before sending: a shard leased anew (at start, at a takeover,
//     under a new token) and a shard whose publish or marker failed is
//     fenced before anything of it is published. Fence makes the relay the
//     shard's only producer and returns the outbox ids of the shard's
//     newest committed transaction; the relay marks them, so a row the
//     broker committed is never sent again, whoever committed it.
//   - One transaction per shard and batch, naming the batch's ids and those
//     of the marker still in flight (at most one, see ACK then marker), so
//     the newest committed transaction of a shard covers every committed
//     row that may lack its marker.
//   - No backoff past the lease while fencing: a fence that fails is retried
//     within a quarter of the lease, so the leases stay renewed.
//
// Parking, order, leases and "marker after ACK" are unchanged.
//
// # Standbys
//
// With Settings.StandbyFlush required, a batch is published only once enough
// of the ledger's physical standbys report flushed a WAL position read
// after the batch (pg_current_wal_insert_lsn, past the commit of every row
// the read could see): a failover to such a standby never promotes a
// ledger without an event the world has seen. The wait happens before the
// lease check that precedes publishing; a hold that outlasts the next lease
// round trip drops the batch, renews the leases and reads it again, so a
// standby that is down holds the relay for as long as it is down, with
// posthorn_relay_held_by_standby_seconds and a log line saying so, and
// nothing is lost (relay/internal/standbygate).
//
// # Lifecycle
//
// Start runs the loop in the background; Stop (or cancelling Start's
// context) stops softly: the in-flight batch is finished (or abandoned if
// its lease is lost), markers are written for what was ACKed, leases are
// released so another relay takes over at once, and Stopped is closed. If
// Stop's context ends first, the batch is cut short and the leases expire
// on their own.
package polling
