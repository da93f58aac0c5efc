package ops

import "context"

// Disposition is one disposition a consumer recorded for an event ID.
type Disposition struct {
	// Disposition is applied, duplicate, parked_gap, parked_poison,
	// rejected, revision_conflict, or the transient held.
	Disposition string
	// Duplicates counts the repeats absorbed for this event ID.
	Duplicates int64
	// Reason is the consumer's reason for a parked, held, rejected or
	// revision_conflict disposition (empty otherwise).
	Reason string
	// ConflictsWith is, for revision_conflict, the event ID applied at the
	// same revision.
	ConflictsWith string
}

// DispositionReader is the port through which reconciliation reads one
// consumer's dispositions. The first adapter is InboxReader (the consumer's
// inbox tables, through a read-only DSN).
type DispositionReader interface {
	// Dispositions returns what was recorded for each of eventIDs, in
	// their order: out[i] for eventIDs[i], empty where nothing was. More
	// than one entry for an ID is possible in stores without a unique key,
	// and is a discrepancy.
	Dispositions(ctx context.Context, eventIDs []string) ([][]Disposition, error)
	// EventIDs calls fn with every event ID the consumer recorded, in
	// batches of up to batch.
	EventIDs(ctx context.Context, batch int, fn func(ids []string) error) error
	// AppliedTwice returns groups of event IDs applied for the same
	// aggregate revision.
	AppliedTwice(ctx context.Context) ([][]string, error)
	// RevisionConflicts returns every event recorded as revision_conflict.
	RevisionConflicts(ctx context.Context) ([]RevisionConflict, error)
}

// PrunedReader is implemented by a DispositionReader whose store prunes
// final dispositions (inbox retention): it says which of the events without
// a disposition its retention may have removed.
type PrunedReader interface {
	Pruned(ctx context.Context, events []ExpectedEvent) (map[string]bool, error)
}

// InboxReader reads a consumer's dispositions from its inbox
// (adapters/postgres/inboxstore.Inbox).
type InboxReader struct {
	Inbox    Inbox
	Consumer string
}

var (
	_ DispositionReader = InboxReader{}
	_ IncrementalReader = InboxReader{}
)

// Dispositions implements DispositionReader: an inbox row is at most one
// disposition per event ID.
func (r InboxReader) Dispositions(ctx context.Context, ids []string) ([][]Disposition, error) {
	recs, err := r.Inbox.Recorded(ctx, r.Consumer, ids)
	if err != nil {
		return nil, err
	}
	out := make([][]Disposition, len(recs))
	for i := range recs {
		if recs[i].Disposition != "" {
			out[i] = recs[i : i+1 : i+1]
		}
	}
	return out, nil
}

// EventIDs implements DispositionReader.
func (r InboxReader) EventIDs(ctx context.Context, batch int, fn func([]string) error) error {
	return r.Inbox.InboxEventIDs(ctx, r.Consumer, batch, fn)
}

// Pruned implements PrunedReader (Inbox.Pruned).
func (r InboxReader) Pruned(ctx context.Context, events []ExpectedEvent) (map[string]bool, error) {
	cands := make([]PrunedCandidate, len(events))
	for i, e := range events {
		cands[i] = PrunedCandidate{EventID: e.EventID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
			Revision: e.Revision, CreatedAt: e.CreatedAt}
	}
	return r.Inbox.Pruned(ctx, r.Consumer, cands)
}

// AppliedTwice implements DispositionReader.
func (r InboxReader) AppliedTwice(ctx context.Context) ([][]string, error) {
	return r.Inbox.AppliedTwice(ctx, r.Consumer)
}

// RevisionConflicts implements DispositionReader.
func (r InboxReader) RevisionConflicts(ctx context.Context) ([]RevisionConflict, error) {
	return r.Inbox.RevisionConflicts(ctx, r.Consumer)
}

// BeginPass implements IncrementalReader.
func (r InboxReader) BeginPass(ctx context.Context, ledgerHistory string) (PassStart, error) {
	return r.Inbox.BeginPass(ctx, r.Consumer, ledgerHistory)
}

// EventIDsSince implements IncrementalReader.
func (r InboxReader) EventIDsSince(ctx context.Context, since uint64, batch int, fn func([]string) error) error {
	return r.Inbox.InboxEventIDsSince(ctx, r.Consumer, since, batch, fn)
}

// AppliedTwiceSince implements IncrementalReader.
func (r InboxReader) AppliedTwiceSince(ctx context.Context, since uint64) ([][]string, error) {
	return r.Inbox.AppliedTwiceSince(ctx, r.Consumer, since)
}

// RecordMark implements IncrementalReader.
func (r InboxReader) RecordMark(ctx context.Context, mark uint64, ledgerHistory, witness string) error {
	return r.Inbox.RecordMark(ctx, r.Consumer, mark, ledgerHistory, witness)
}

// ConsumerSource names a consumer and its disposition reader.
type ConsumerSource struct {
	Name   string
	Reader DispositionReader
	// RejectedFinal makes `rejected` a final disposition for this consumer
	// (reconcile.consumers[].rejected_final): it declares that an event it
	// cannot apply is, for it, correctly handled. Otherwise a rejected event
	// is unproven, like a parked or held one.
	RejectedFinal bool
	// Topics are the outbox topics the consumer subscribes to
	// (reconcile.consumers[].topics): the cut's rows on them are matched
	// against its dispositions. None means the ledger's events topic.
	Topics []string
	// BalanceView, when set, is held against the journal
	// (reconcile.consumers[].balance_view; reconcile_ledger.go).
	BalanceView BalanceViewReader
}
