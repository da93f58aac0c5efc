// Package consumers registers handlers on a Watermill router and gives each
// one the inbox, the revision-gap check, dispositions, retries and metrics,
// so a team writes its effect and no SQL of the inbox.
//
// A handler is a Handler: it gets the consumer database's pgx.Tx and the
// event's envelope, and writes its effect through the transaction. The
// inbox row and the effect commit together in that transaction.
//
// The inbox is a port (Inbox) the Registry is given in Config.Inbox;
// adapters/postgres/inboxstore.Inbox implements it on the consumers' own database.
// consumers imports no adapter.
//
// # Registration
//
// Events (kind "event", topic core.TopicEvents or any topic outside the
// command prefix) fan out to any number of consumers: AddEventHandler.
// Commands (kind "command", topic "commands.<service>") have exactly one
// owner: AddCommandHandler refuses a second consumer on the same command
// topic. Either refuses the other's topic at registration, and at run time
// a record whose kind header does not match its handler is recorded as
// rejected and acknowledged, never handled.
//
// # Invariants
//
//   - Exactly once in effect per (consumer, event ID): the inbox's primary
//     key is inserted in the handler's transaction, so a repeat — a
//     redelivery, a resend, a replay, or the same event received by two
//     instances at once — finds the row, is acknowledged without calling the
//     handler and is counted as a duplicate (the row's duplicates column).
//   - Non-transactional side effects of a handler (HTTP calls, e-mails,
//     anything not written through the given tx) are NOT covered: they may
//     repeat when a transaction fails after them or a delivery is retried.
//     Make them idempotent yourself.
//   - Per aggregate (the account), a handler registered with
//     DependsOnPredecessor sees revisions strictly in order last+1, never
//     one skipped. A higher revision is a gap. A lower one is a duplicate
//     only as the event ID applied at it (a resend, a replay).
//   - A duplicate is the same event ID, nothing else. A different event ID
//     at a revision the consumer already applied (ordered or not) is a
//     revision_conflict: recorded with both IDs, never applied, counted,
//     logged at ERROR; an ordered consumer parks the aggregate. (Only when
//     the inbox holds no applied event of that revision to compare with,
//     below a baseline's positions or after retention, does an ordered
//     consumer call it a duplicate by revision.)
//   - Nothing is lost: every delivery ends in a committed disposition
//     (applied, duplicate, parked_gap, parked_poison, rejected,
//     revision_conflict), or in the transient held state, before the broker
//     message is acknowledged; an error leaves it unacknowledged, so the
//     broker redelivers it.
//
// # Batches
//
// The deliveries waiting for a handler at the same time are applied in one
// transaction (Inbox.ReceiveBatch): one inbox row and at most one
// effect per event, one commit. Each event gets the disposition it would
// have got alone, applied in (aggregate, revision) order, and every message
// of the batch is acknowledged only after the commit. A handler may add a
// set-based BatchHandler (WithBatchHandler) for the run; on any error the
// batch is rolled back and its events are received one by one with the
// Handler, so retries and poison parking are those of a single event.
// Deliveries join the queue in the order the subscriber delivered them, and
// each handler has four lanes split by aggregate, so one lane's commit
// overlaps the next lane's batch while an aggregate stays in one lane.
// Config.MaxBatch bounds a batch (1: a transaction per event). The Kafka
// subscriber (package subscribers) delivers many messages per partition
// ahead of their acknowledgements, so batches fill; its committed offset
// never passes a message that is not acknowledged.
//
// # Revision gaps: hold, park, release
//
// An event that arrives ahead of its predecessor is not retried in place by
// nacking it: on Kafka its predecessor, resent or replayed, sits behind it
// on the same partition (the record key is the account), so a nack loop
// would block the partition — every account on it — and could never let the
// predecessor through. Instead the event is stored in the inbox as held,
// with its headers and payload, and the broker message is acknowledged. The
// held event is retried from the inbox: at once whenever its aggregate
// advances (the instance that applies revision r drains r+1, r+2, … in
// order, each in its own transaction, when it saw, under the aggregate's
// position lock, that any are held), and by a per-consumer sweeper that
// runs every SweepInterval on every instance. If the predecessor has not
// arrived within the hold time, the sweeper parks the aggregate: the
// position row is marked parked with a reason naming the missing revisions,
// the held events become parked_gap, the gap counter and parked gauge move
// and a log line says so. Every later event of a parked aggregate is stored
// as parked_gap too — never applied ahead, never skipped.
//
// Releasing (Registry.Release, or `posthorn consume release --consumer NAME
// --account ID` against the database while the consumer runs) unparks the
// aggregate and turns its parked events back into held ones; they are then
// re-driven from the inbox in revision order as soon as their predecessor
// is applied — typically the missing event brought by a replay, which was
// stored as parked_gap while the park lasted and is now first in line. If
// the predecessor is still missing, the aggregate parks again after the
// hold time. The kept copy of an event is dropped once it is applied.
//
// # Poison
//
// A handler error is retried with backoff as Config.Retry says (a panic is
// turned into an error by Watermill's Recoverer first); when the retries
// are exhausted the message is nacked and the broker redelivers it.
// An error marked permanent (Permanent, or core.Permanent) is not retried:
// the event is stored as parked_poison with the error as reason and
// acknowledged. For a DependsOnPredecessor handler its aggregate is parked
// too (later revisions depend on it); other aggregates keep flowing. A
// release re-drives the poisoned event like a gap's.
//
// # Metrics
//
// posthorn_consumer_messages_total{consumer,disposition} counts each
// disposition as it is recorded (an event parked and later released and
// applied counts under both); posthorn_consumer_revision_gaps_total counts
// events received ahead of their predecessor; posthorn_consumer_duplicate_ratio,
// posthorn_consumer_parked_aggregates, posthorn_consumer_held_events,
// posthorn_consumer_handler_seconds, and posthorn_consumer_lag_seconds (age
// of the last event handled: now minus its occurred_at), which works for
// every sink. Watermill's Subscriber interface exposes no broker lag; where
// the concrete subscriber does (watermill-kafka: record offsets in the
// message context, high-water marks through PartitionOffset), package
// subscribers adds posthorn_consumer_offset_lag{consumer,topic,partition}.
//
// # Tracing
//
// With Config.TracerProvider set, each delivery runs in an "apply
// <consumer>" span continuing the record's W3C traceparent (the relay's
// publish span), around the inbox transaction and the handler, ended with
// the disposition or the error (trace.go). Without it nothing is traced and
// nothing is read from the headers.
package consumers
