// Package ledgerstore is the ledger store behind the Posting API: it
// writes a posting, its journal (whose lines hold its accounts' new
// revisions and balances) and its outbox rows in one transaction, through
// Watermill's SQL
// publisher with this package's outbox schema adapter, and reads postings
// and accounts back.
//
// Invariant: every outbox row is inserted after the row lock of its
// aggregate is taken in the same transaction, so per aggregate the outbox id
// order equals revision order, and a row can only become visible after all
// rows of its aggregate with smaller revisions are visible. An account's
// balance in a currency is the balance_after of its newest line in it, so
// a posting reads its balances under the same lock, and updates no row. A
// posting is
// refused, and nothing written, while the ledger's history is not the
// accepted one.
package ledgerstore
