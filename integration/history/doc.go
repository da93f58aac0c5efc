// Package history measures what Posthorn's work costs as the ledger's
// history grows: BenchmarkHistory runs the same fixed work on an empty
// ledger and consumer database and on ones already holding N events of
// history (POSTHORN_HISTORY_EVENTS, default 1,000,000; the soak's is
// 10,000,000), and prints each figure for both and their ratio N/0. A
// figure more than 1.5 times worse with the history is flagged: work
// whose cost follows the history when it need not is what this looks
// for.
//
// The history is written set-based (generate_series), never posted one by
// one, in the shape the write path, the relay and the example consumers
// leave it (load_test.go): journals and their lines on 10,000 accounts,
// their idempotency keys, the accounts' revisions and balances, the
// outbox rows, all relayed; both example consumers' applied inbox rows,
// the audit log, the projection's balances and positions. The databases
// are vacuumed and analyzed and a checkpoint taken after the load, so no
// figure pays for it. The empty database holds the same accounts at
// revision 0: it differs in history alone.
//
// On each database, in this order:
//   - the write path: 8,000 two-line postings through ledgerstore.Post from
//     8 writers, on the loaded accounts (postings/s);
//   - the relay: the polling relay, in process, draining those 16,000
//     events to the Kafka sink on kfake (events/s), then its commit-to-ACK
//     p99 under 200 postings/s for 10 s;
//   - consumer apply: both example consumers with the inbox, in process,
//     reading everything relayed from kfake (events/s per consumer, from
//     its first applied event to its last);
//   - the failover check (three sources: both inboxes and the audit log),
//     reconcile, archive and cleanup over everything, as the ops package
//     runs them: the first pass, over a history never archived, whose
//     cost grows with it by nature;
//   - 1,000 more postings, relayed and applied, then reconcile, archive,
//     cleanup and the failover check again: the incremental pass an
//     operator's schedule runs, whose cost need not grow. Reconcile reads
//     each consumer's history from the mark its first pass recorded; the
//     same pass with the marks set aside (Full) follows it, as it ran
//     before there were marks: every inbox event ID outside its cut looked
//     up in the outbox, and those the outbox no longer has in the archive.
//     Should the pass fail, that is the figure (failed, and why), and
//     archive and cleanup, which need the coverage a clean reconcile
//     records, are not run.
//
// It loads millions of rows, so `make bench` does not run it:
//
//	make bench-history   # 1,000,000 events, under 10 minutes
//	make soak-history    # 10,000,000 events
//
// or directly:
//
//	POSTHORN_BENCH_1M=1 POSTHORN_HISTORY_EVENTS=1000000 go test -run '^$' -bench BenchmarkHistory -benchtime 1x -count 1 -timeout 30m ./integration/history/
//
// It needs the local PostgreSQL that scripts/setup-machine sets up.
package history
