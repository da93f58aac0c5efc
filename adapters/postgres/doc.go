// Package postgres is Posthorn's PostgreSQL adapter: the embedded schema
// migrations of the ledger and of the example consumers, the ledger store
// that writes a posting and its outbox rows in one transaction, the outbox
// schema adapter for Watermill's SQL publisher, and the relay's and
// consumers' stores.
//
// Invariant: every outbox row is inserted after the row lock of its
// aggregate is taken in the same transaction, so per aggregate the outbox id
// order equals revision order, and a row can only become visible after all
// rows of its aggregate with smaller revisions are visible.
package postgres
