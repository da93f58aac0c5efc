// Package relaystore is the polling relay's view of the ledger database
// (polling.Store, and the outbox reads of the CDC relay, cdc.OutboxStore): it reads unrelayed outbox rows shard by shard, writes the
// fenced markers that settle them, keeps the shard leases, parks and
// releases aggregates, dead-letters a record, and reports the standbys'
// flush position and the relay's backlog.
//
// Invariant: a marker is written only in shards whose lease still carries
// the token the relay holds, so a relay that lost its lease can mark
// nothing its successor is responsible for.
package relaystore
