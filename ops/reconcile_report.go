package ops

import (
	"encoding/json"
	"time"
)

// Class is one discrepancy class: how many, and the first Cap IDs.
type Class struct {
	Count int64    `json:"count"`
	IDs   []string `json:"ids"`
	// OldestAgeSeconds is set for unrelayed: the age of the oldest row.
	OldestAgeSeconds float64 `json:"oldest_age_seconds,omitempty"`
}

// MarshalJSON lists no IDs as [] rather than null.
func (c Class) MarshalJSON() ([]byte, error) {
	type plain Class
	if c.IDs == nil {
		c.IDs = []string{}
	}
	return json.Marshal(plain(c))
}

func (c *Class) add(cap int, ids ...string) {
	for _, id := range ids {
		c.Count++
		if len(c.IDs) < cap {
			c.IDs = append(c.IDs, id)
		}
	}
}

// Discrepancies are the classes reconciliation reports per consumer.
type Discrepancies struct {
	// JournalWithoutEvents lists journal IDs with a line that has no event.
	JournalWithoutEvents Class `json:"journal_without_events"`
	// Unrelayed lists event IDs of the cut still without a relay marker.
	Unrelayed Class `json:"unrelayed"`
	// Unproven lists relayed event IDs with no final disposition: none at
	// all, or one that still waits for an operator or a predecessor
	// (parked_gap, parked_poison, held, revision_conflict; rejected unless
	// the consumer is configured with rejected_final).
	Unproven Class `json:"unproven"`
	// Waiting names, for the first Cap of the unproven events that have a
	// disposition, what it is and the consumer's reason.
	Waiting []WaitingEvent `json:"waiting,omitempty"`
	// Unknown lists event IDs the consumer recorded that the ledger never had.
	Unknown Class `json:"unknown"`
	// MultipleApplied lists event IDs applied more than once (or whose
	// aggregate revision was applied under another event ID too).
	MultipleApplied Class `json:"multiple_applied"`
	// RevisionConflicts names every event the consumer recorded as
	// revision_conflict, with the event ID applied at its revision: never
	// covered, whether or not the event is of the cut.
	RevisionConflicts ConflictClass `json:"revision_conflicts"`
}

func (d Discrepancies) total() int64 {
	return d.JournalWithoutEvents.Count + d.Unrelayed.Count + d.Unproven.Count + d.Unknown.Count + d.MultipleApplied.Count +
		d.RevisionConflicts.Count
}

// WaitingEvent is an unproven event the consumer has seen but not finished
// with: parked (gap or poison), held, or rejected without rejected_final.
type WaitingEvent struct {
	EventID     string `json:"event_id"`
	Consumer    string `json:"consumer"`
	Disposition string `json:"disposition"`
	Reason      string `json:"reason"`
}

// ConsumerReport is one consumer's reconciliation.
type ConsumerReport struct {
	Name               string `json:"name"`
	Expected           int64  `json:"expected"`
	Relayed            int64  `json:"relayed"`
	Applied            int64  `json:"applied"`
	DuplicatesAbsorbed int64  `json:"duplicates_absorbed"`
	Parked             int64  `json:"parked"`
	// Pruned counts events whose disposition inbox retention removed after
	// an earlier run had proven them (at or below the recorded coverage).
	Pruned        int64         `json:"pruned"`
	Rejected      int64         `json:"rejected"`
	Discrepancies Discrepancies `json:"discrepancies"`
	Clean         bool          `json:"clean"`
	Coverage      *Coverage     `json:"coverage,omitempty"`
	// BalanceView is the consumer's declared balance view held against
	// the journal (nil: it declares none).
	BalanceView *BalanceViewCheck `json:"balance_view,omitempty"`
	// Pass says whether the whole-history checks read from a mark (nil:
	// the consumer's reader keeps none, and they read everything).
	Pass *PassInfo `json:"pass,omitempty"`
}

// CutInfo describes the cut a report is about.
type CutInfo struct {
	Sequence        int64     `json:"sequence"`
	LastCommitted   int64     `json:"last_committed"`
	Floor           int64     `json:"floor"`
	CoveredOutboxID int64     `json:"covered_outbox_id"`
	TakenAt         time.Time `json:"taken_at"`
	WaitedSeconds   float64   `json:"waited_seconds"`
}

// Report is the result of Reconcile.
type Report struct {
	Cut       CutInfo          `json:"cut"`
	Consumers []ConsumerReport `json:"consumers"`
	// Ledger is the ledger proved from its journal (reconcile_ledger.go).
	Ledger LedgerProof `json:"ledger"`
	// Unwatched lists the cut's events on topics no configured consumer
	// subscribes to; UnwatchedTopics counts the rows by topic (commands
	// included, which are listed only). See reconcile_topics.go.
	Unwatched       Class            `json:"unwatched"`
	UnwatchedTopics []UnwatchedTopic `json:"unwatched_topics,omitempty"`
	Clean           bool             `json:"clean"`
}
