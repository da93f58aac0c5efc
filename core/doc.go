// Package core holds Posthorn's domain and its ports: the envelope that every
// event and command travels in, the wire headers, the sink port the relay
// publishes through, and the errors the rest of the code classifies.
//
// Invariants the rest of the code relies on:
//   - An event ID is fixed when the outbox row is written and never changes:
//     every attempt, resend and replay carries the same ID.
//   - Per aggregate (for ledger events, the account) revisions are gapless,
//     1, 2, 3 …, and an aggregate always maps to the same shard.
//   - Events are facts fanned out to any number of consumers; commands are
//     intents with exactly one owner and are never re-issued by a replay
//     unless the operator explicitly asks for it.
//
// core imports no database driver and no broker client; adapters do.
package core
