// Package opsstore is the operators' view of the ledger database
// (ops.Store): consistent cuts for reconciliation, coverage records,
// cleanup and archive, resend and replay reads, and the ledger proof of a
// consumer's balances; and the failover store that finds and rebuilds the
// postings a promotion lost.
//
// Invariant: cleanup deletes only rows below the lowest cut that the
// required consumers' recorded coverage proves, and a cut is read in one
// snapshot.
package opsstore
