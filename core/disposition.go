package core

import "time"

// Disposition is what a consumer did with an event ID (mission.md,
// vocabulary). The consumers' inbox records one per consumer and event ID;
// reconciliation reads them to prove that every relayed event was handled.
type Disposition string

const (
	// DispositionHeld is transient: the event arrived ahead of its predecessor and
	// waits in the inbox, inside the hold time, for the gap to close.
	DispositionHeld Disposition = "held"
	// DispositionApplied: the handler's effect committed with the inbox row.
	DispositionApplied Disposition = "applied"
	// DispositionDuplicate: the event's revision was already applied under another
	// event ID. Repeats of an event ID that already has a row are counted in
	// that row's Duplicates instead.
	DispositionDuplicate Disposition = "duplicate"
	// DispositionParkedGap: the event waits behind a missing predecessor (or behind a
	// parked event of its aggregate) until an operator releases the park.
	DispositionParkedGap Disposition = "parked_gap"
	// DispositionParkedPoison: the handler failed permanently on this event.
	DispositionParkedPoison Disposition = "parked_poison"
	// DispositionRejected: the record can never be applied by this consumer (bad
	// envelope, or a command delivered to an event handler or the reverse).
	DispositionRejected Disposition = "rejected"
)

// Dispositions are all the dispositions an inbox row can hold; a new
// disposition joins this list. Read it, never change it.
var Dispositions = [...]Disposition{DispositionApplied, DispositionDuplicate, DispositionHeld,
	DispositionParkedGap, DispositionParkedPoison, DispositionRejected}

// InboxRecord is one event's inbox row as status and reconciliation read
// it.
type InboxRecord struct {
	EventID       string
	AggregateType string
	AggregateID   string
	Revision      int64
	Disposition   Disposition
	Reason        string
	// Duplicates is how many repeats of this event ID were absorbed.
	Duplicates int
	ReceivedAt time.Time
	UpdatedAt  time.Time
}
