// Package postgres is the base of Posthorn's PostgreSQL adapter: the
// connection pool, the embedded schema migrations of the ledger and of the
// consumers, the per-component roles and consumer identities, the ledger's
// settings, the names the ledger's writers and the relay share, and the
// watch over the ledger's history (HistoryWatch). It imports no business
// package but core.
//
// The stores live in one package per port they serve, each over this base:
//
//   - ledgerstore: the ledger store behind the Posting API (api.LedgerStore)
//     and Watermill's outbox schema adapter on its write path;
//   - relaystore: the polling relay's store (polling.Store) and the CDC
//     relay's outbox reads (cdc.OutboxStore);
//   - cdcsource: the CDC relay's source (cdc.Source) and replication stream;
//   - inboxstore: the consumers' inbox (consumers.Inbox, ops.Inbox);
//   - opsstore: the operators' store (ops.Store) and the failover store;
//   - consolestore: the operator console's store (console.Store).
//
// Invariant: the schema the migrations create is the only schema any
// store reads or writes, and a role's grants in roles/ are the whole of
// what a component may do to it.
package postgres
