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
	// DispositionDuplicate: a repeat of an event ID. Repeats of an event ID
	// that already has a row are counted in that row's Duplicates; a row is
	// Duplicate itself only for an ordered consumer's event at or below its
	// aggregate's last applied revision when the inbox holds no applied event
	// of that revision to compare IDs with (positions set by a baseline, or
	// rows removed by retention after the replay window).
	DispositionDuplicate Disposition = "duplicate"
	// DispositionRevisionConflict: another event ID was already applied at
	// this event's aggregate revision. A duplicate is the same event ID,
	// nothing else: this is a different event (a ledger that failed over to a
	// standby missing its last postings reissues revisions), so it is never
	// applied and never covered. The row names the applied event ID and
	// keeps the event; an ordered consumer parks the aggregate.
	DispositionRevisionConflict Disposition = "revision_conflict"
	// DispositionParkedGap: the event waits behind a missing predecessor (or behind a
	// parked event of its aggregate) until an operator releases the park.
	DispositionParkedGap Disposition = "parked_gap"
	// DispositionParkedPoison: the handler failed permanently on this event.
	DispositionParkedPoison Disposition = "parked_poison"
	// DispositionRejected: the record can never be applied by this consumer (bad
	// envelope, or a command delivered to an event handler or the reverse).
	DispositionRejected Disposition = "rejected"
	// DispositionSkipped: the event is a skip marker (TypeDeadLettered): an
	// operator dead-lettered the record the sink could never take. The
	// handler is not called; an ordered consumer advances past its revision.
	// It is final: the gap is named, never silent.
	DispositionSkipped Disposition = "skipped"
)

// Dispositions are all the dispositions an inbox row can hold; a new
// disposition joins this list. Read it, never change it.
var Dispositions = [...]Disposition{DispositionApplied, DispositionDuplicate, DispositionHeld,
	DispositionParkedGap, DispositionParkedPoison, DispositionRejected, DispositionRevisionConflict, DispositionSkipped}

// InboxRecord is one event's inbox row as status and reconciliation read
// it.
type InboxRecord struct {
	EventID       string
	AggregateType string
	AggregateID   string
	Revision      int64
	Disposition   Disposition
	Reason        string
	// ConflictsWith is the event ID applied at this revision, for a
	// RevisionConflict.
	ConflictsWith string
	// Duplicates is how many repeats of this event ID were absorbed.
	Duplicates int
	ReceivedAt time.Time
	UpdatedAt  time.Time
}
