package core

import "hash/fnv"

// Shards is the number of outbox shards. It is part of the schema: every
// row's shard is computed from its aggregate ID at write time, and an
// aggregate must never change shard, or two relays could send its events
// concurrently and out of order. Changing it needs a migration that drains
// the outbox first.
const Shards = 16

// ShardOf returns the shard of an aggregate: FNV-1a of its ID modulo Shards.
func ShardOf(aggregateID string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(aggregateID))
	return int(h.Sum32() % Shards)
}
