// Package horizon holds make bench-horizon and the long-snapshot run of
// make soak: the relay and the write path while a long REPEATABLE READ
// snapshot pins the ledger's MVCC horizon, measured as production would
// meet it, with every part a process of its own. It has no code of its
// own; the benchmark is in its test files, and it is kept out of make
// bench because one run takes minutes.
//
// One run, for each relay mode asked (polling, CDC) and each of two
// builds of posthorn (the old design, built from a git worktree of an
// older commit, and the tree under test), one after the other:
//
//   - a throwaway PostgreSQL cluster (wal_level=logical, pg_stat_statements
//     loaded), migrated by that build's `posthorn migrate`;
//   - `posthorn dev kafka` (always the tree under test's: the broker is not
//     what is compared), that build's `posthorn relay` and `posthorn api`;
//   - publishers calling posthorn_publish at a fixed total rate, half of the
//     events on a few hot aggregates and half on many cold ones, and
//     clients posting to the Posting API at a fixed rate, each posting on
//     one of a few hot accounts;
//   - a reader of the topics (franz-go) that takes each event's latency as
//     its Kafka record's timestamp (set by the relay's producer) minus the
//     event's occurred_at header (set in the publishing transaction), to
//     the millisecond of the record's timestamp;
//   - calm for a while, then a REPEATABLE READ snapshot held open, then calm
//     again, cut into windows: per window the latency's p50 and p99, the
//     rates the publishers and the API reached (they ask for a fixed rate
//     and fall behind when the database slows them), the dead entries of
//     outbox_pending (pg_stat_user_tables.n_dead_tup), and the relay's
//     read and marker statements' mean time and buffers per call
//     (pg_stat_statements, reset every window).
//
// Every event a publisher or the API committed must be read back from the
// topic, or the run fails: a figure taken over lost events would hide the
// incident it should show.
package horizon
