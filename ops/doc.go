// Package ops is the operators' side of Posthorn: reconciliation by cut,
// resend, historical replay, archive and cleanup. It proves before it
// deletes.
//
// # Cut
//
// A cut N is "every journal with sequence <= N that is visible". The
// sequence is taken by a posting's last statement, close to but not exactly
// in commit order, so a cut is only used once it is provable: Store.OpenCut
// waits until no transaction that may still commit a sequence <= N is in
// flight, then takes one REPEATABLE READ read-only snapshot; everything
// about the ledger in a reconciliation is read from it.
//
// # Ports
//
// ops imports no adapter: it declares the stores it calls, with the types
// they exchange, in store.go: each operation's narrow port on the ledger
// database (ReconcileStore, ArchiveLedger, CleanupStore, ReplayStore,
// ResendStore, RetentionStore, and FailoverStore in failover.go), Store
// (all of them), and Inbox (a consumer's inbox);
// adapters/postgres/opsstore and inboxstore implement them.
//
// # Coverage
//
// The cut's rows are the outbox rows of its journals and every row of no
// journal (the publish library's and the SQL functions') up to X, the
// largest outbox id of a row below which every row is final and belongs to
// a journal <= N or to none. Each row is matched against the consumers
// subscribed to its topic (ConsumerSource.Topics).
//
// A consumer is covered up to cut N when every row of the cut on its
// topics has a final disposition in its inbox (applied or duplicate;
// rejected only for a consumer configured with rejected_final; parked and
// held events are unproven and reported with their reason), none of them
// is unrelayed, no journal line lacks its event, the consumer knows no
// event ID the ledger does not, no aggregate revision was applied twice,
// and its balance view, if it declares one, agrees with the journal. Only
// then, and only if the ledger itself agrees with its journal (balances,
// revisions and its events; reconcile_ledger.go), does Reconcile record
// (consumer, N, X) in ops_coverage, with X lowered below the first event
// no consumer subscribes to (reconcile_topics.go). Coverage only ever
// advances. "Knows no event ID the ledger does not" and "no revision
// applied twice" are proven once per inbox change: a clean pass records a
// mark in the consumer's database below which every change was read and
// proven, and the next pass proven against the same ledger history reads
// only the changes at or after it (reconcile_marks.go).
//
// # Archive and cleanup
//
// Archive writes rows (archive coverage, T] to segments, where T is the
// lowest X of the required consumers, capped below the first unrelayed row.
// A segment is recorded in the ledger only after it and the manifest were
// written durably and read back with a matching SHA-256. Cleanup deletes a
// row only if it is relayed, at or below every required consumer's X and
// the archive coverage, older than the replay window, and of a journal at
// or below the cleanup's journal floor (so a journal's rows go together and
// reconciliation can start above the floor). Deletes run in short batches
// by id, each its own transaction.
//
// # Replay and resend
//
// Both send stored rows with their original event IDs, in outbox id order
// (per account, revision order). Replay sets the replay header, sends only
// relayed rows, skips commands unless asked, reads rows already cleaned up
// from the archive, and saves its position after every ACKed batch so it
// can resume. Resend writes the marker of unrelayed rows only after the
// sink's ACK and refuses to overtake an unrelayed predecessor.
package ops

// Defaults of the operations' configs (configs takes its defaults from here).
const (
	// DefaultSegmentRows is ArchiveConfig.SegmentRows's default.
	DefaultSegmentRows = 10000
	// DefaultBatchSize is the rows deleted per transaction by cleanup and
	// retention unless configured.
	DefaultBatchSize = 1000
)
