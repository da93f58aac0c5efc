package consumers

import (
	"context"
	"fmt"
	"time"

	"github.com/posthorn/posthorn/core"
)

// Inbox is the store the Registry records every delivery in: one inbox row
// per consumer and event ID, written in the transaction that applies the
// event, and for an ordered consumer (DependsOnPredecessor) one position per
// aggregate. adapters/postgres/inboxstore.Inbox implements it on the consumers' own
// database.
//
// Who may implement it: a store that writes the inbox row, the handler's
// effect and the position in one transaction of the database the effect is
// in; without that, one effect per event ID does not hold.
// adapters/postgres/inboxstore.Inbox is the one such implementation, and the SQL
// function posthorn_inbox_receive applies the same rule for consumers
// outside Go.
//
// Every method commits or records nothing. Receive, ReceiveBatch and Drain
// return *ApplyError when the handler failed (nothing was recorded); any
// other error is the store's. Implementations serialise the calls for one
// aggregate of an ordered consumer across all instances.
type Inbox interface {
	// Receive records one delivered event and, when it is next in line,
	// applies it with apply in the same transaction. After an outcome with
	// HeldSuccessors the caller drains the aggregate.
	Receive(ctx context.Context, consumer string, ordered bool, e core.Envelope, apply Handler) (Outcome, error)
	// ReceiveBatch records a run of deliveries in one transaction, each with
	// the disposition Receive would give it; all or nothing. applyAll, when
	// not nil, applies every event to be applied in one call.
	ReceiveBatch(ctx context.Context, consumer string, ordered bool, es []core.Envelope, apply Handler, applyAll BatchHandler) (BatchOutcome, error)
	// Drain re-drives the aggregate's held events in revision order until
	// none is next in line, and returns what it recorded.
	Drain(ctx context.Context, consumer string, ordered bool, aggregateType, aggregateID string, apply Handler) ([]Outcome, error)
	// ParkPoison records that the handler failed permanently on e.
	ParkPoison(ctx context.Context, consumer string, ordered bool, e core.Envelope, reason string) (Outcome, error)
	// Reject records a delivery this consumer can never apply.
	Reject(ctx context.Context, consumer, eventID string, e core.Envelope, headers map[string]string, payload []byte, reason string) (Outcome, error)
	// ParkExpiredHolds parks the aggregates of an ordered consumer whose
	// oldest held event waited longer than hold for its predecessor.
	ParkExpiredHolds(ctx context.Context, consumer string, hold time.Duration) ([]Parked, error)
	// Runnable lists the aggregates with held events Drain would apply now.
	Runnable(ctx context.Context, consumer string, ordered bool) ([]core.AggregateKey, error)
	// Waiting counts the consumer's held events and parked aggregates.
	Waiting(ctx context.Context, consumer string) (held, parkedAggregates int64, err error)
	// Release lifts the park of one aggregate and returns how many events
	// went back to held.
	Release(ctx context.Context, consumer, aggregateType, aggregateID string) (int, error)
}

// ApplyError is returned by the Inbox when the handler failed; the
// transaction was rolled back and nothing was recorded. Envelope is the
// event it failed on (for Drain, one that was re-driven from the inbox).
type ApplyError struct {
	Envelope core.Envelope
	Err      error
}

func (e *ApplyError) Error() string {
	return fmt.Sprintf("handler failed on event %s (%s %s revision %d): %v",
		e.Envelope.EventID, e.Envelope.AggregateType, e.Envelope.AggregateID, e.Envelope.Revision, e.Err)
}

func (e *ApplyError) Unwrap() error { return e.Err }

// Outcome is the disposition recorded for one delivery or re-drive.
type Outcome struct {
	EventID       string
	AggregateType string
	AggregateID   string
	Revision      int64
	Disposition   core.Disposition
	// Repeat is set when the event ID already had a row: the delivery was
	// absorbed and counted in that row's duplicates. Disposition is then
	// Duplicate.
	Repeat bool
	Reason string
	// ConflictsWith is the event ID already applied at this revision, for a
	// RevisionConflict: the event was recorded, not applied.
	ConflictsWith string
	// GapDetected is set when this delivery found a revision gap (the
	// event is Held).
	GapDetected bool
	// HeldSuccessors is set on an event Receive applied for an ordered
	// consumer when events of its aggregate were held in the inbox at its
	// commit: read under the aggregate's position lock, so no other
	// instance can have held one unseen. Without it there is nothing to
	// drain.
	HeldSuccessors bool
}

// OutcomeOf is the outcome of e before anything is recorded.
func OutcomeOf(e core.Envelope) Outcome {
	return Outcome{EventID: e.EventID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Revision: e.Revision}
}

// Parked is an aggregate parked by ParkExpiredHolds or ParkPoison.
type Parked struct {
	core.AggregateKey
	Reason   string
	ParkedAt time.Time
	// Events is how many of its events wait in the inbox.
	Events int
}

// BatchOutcome is what ReceiveBatch recorded: one outcome per envelope, in
// the order given, and the aggregates of an ordered consumer that now have
// held events (the caller drains them, as after an Applied Receive).
type BatchOutcome struct {
	Outcomes []Outcome
	Held     []core.AggregateKey
}
