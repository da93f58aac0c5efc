// Package cdcsource is the CDC relay's source (cdc.Source): the
// replication slot and its lease, the publication, the pgoutput stream of
// committed outbox rows in commit order, fenced markers, and the branch
// point of the ledger's timeline after a failover.
//
// Invariant: a stream yields only committed outbox rows, in commit order,
// each decoded by the same scan as the polling relay's read, so a row means
// the same envelope on either path; markers are written only by the holder
// of the slot's current lease.
package cdcsource
