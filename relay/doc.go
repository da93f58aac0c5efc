// Package relay is what the relay's two modes share: the one settings
// type both take (Settings, with the configuration's keys, defaults and
// checks), the sink's exactly-once port (FencedSink) and the wrapper that
// keeps it (Wrap, Formatted), the outbox port both read (Outbox), the
// ledger's standbys and history as a relay waits for them (StandbyProbe,
// HistoryGate), and the shared errors. The modes are sibling packages over
// it, neither importing the other:
//
//   - relay/polling (relay.mode: polling, the default) reads the outbox's
//     work queue by leased shard;
//   - relay/cdc (relay.mode: cdc) streams the outbox's inserts from a
//     logical replication slot.
//
// Under relay/internal is the machinery both run on: lifecycle (Start and
// a soft or hard Stop), delivery (publish, settle the sink's answer,
// retry, park a record that keeps failing, exactly-once fences),
// relaymetrics (the series the contract names, reported alike by both
// modes), standbygate and historyhold (holding batches for the standbys
// and for an accepted ledger history).
//
// # Invariants both modes keep
//
//   - ACK then marker: a row is marked relayed only after the sink ACKed
//     its record; a crash in between repeats it with the same event ID,
//     which the consumers' inbox absorbs, and never loses it.
//   - Per aggregate, records reach the sink in revision order; a record the
//     sink rejects for good parks its aggregate alone.
//   - A lease (a shard's, or the CDC slot's) fences every marker: a relay
//     that lost it cannot mark, and does not publish past its expiry.
//   - With StandbyFlush required, nothing is published before the ledger's
//     standbys have flushed it; with a HistoryGate, nothing while the
//     ledger runs on a history an operator has not accepted.
//
// Settings are plain data: configs decodes the relay. keys straight into
// them, and Validate names the key of a bad value. Test hooks are not
// settings: each mode takes them in NewWithHooks.
package relay
