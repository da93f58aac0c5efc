package ops

import "encoding/json"

// RevisionConflict is an event a consumer received at an aggregate
// revision it had already applied under another event ID, and recorded as
// revision_conflict instead of applying it. A duplicate is the same event ID
// and nothing else, so a conflict is never covered: two events claim one
// revision (typically a ledger that failed over to a standby missing its
// last postings, reissuing revisions the world has already seen), and one
// of them is missing from the consumer's effect.
type RevisionConflict struct {
	// EventID is the event recorded as revision_conflict (not applied).
	EventID string `json:"event_id"`
	// AppliedEventID is the event applied at the same revision before it.
	AppliedEventID string `json:"applied_event_id"`
	AggregateType  string `json:"aggregate_type"`
	AggregateID    string `json:"aggregate_id"`
	Revision       int64  `json:"revision"`
}

// ConflictClass is the revision conflicts of one consumer: how many, and the
// first Cap of them with both event IDs.
type ConflictClass struct {
	Count     int64              `json:"count"`
	Conflicts []RevisionConflict `json:"conflicts"`
}

// MarshalJSON lists no conflicts as [] rather than null.
func (c ConflictClass) MarshalJSON() ([]byte, error) {
	type plain ConflictClass
	if c.Conflicts == nil {
		c.Conflicts = []RevisionConflict{}
	}
	return json.Marshal(plain(c))
}

func (c *ConflictClass) add(cap int, rc RevisionConflict) {
	c.Count++
	if len(c.Conflicts) < cap {
		c.Conflicts = append(c.Conflicts, rc)
	}
}
