package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/posthorn/posthorn/core"
)

// Disposition is one disposition a consumer recorded for an event ID.
type Disposition struct {
	// Disposition is applied, duplicate, parked_gap, parked_poison,
	// rejected, or the transient held.
	Disposition string
	// Duplicates counts the repeats absorbed for this event ID.
	Duplicates int64
	// Reason is the consumer's reason for a parked, held or rejected
	// disposition (empty otherwise).
	Reason string
}

// DispositionReader is the port through which reconciliation reads one
// consumer's dispositions. The first adapter is InboxReader (the consumer's
// inbox tables, through a read-only DSN).
type DispositionReader interface {
	// Dispositions returns what was recorded for each of eventIDs; an ID
	// without any is absent. More than one entry for an ID is possible in
	// stores without a unique key, and is a discrepancy.
	Dispositions(ctx context.Context, eventIDs []string) (map[string][]Disposition, error)
	// EventIDs calls fn with every event ID the consumer recorded, in
	// batches of up to batch.
	EventIDs(ctx context.Context, batch int, fn func(ids []string) error) error
	// AppliedTwice returns groups of event IDs applied for the same
	// aggregate revision.
	AppliedTwice(ctx context.Context) ([][]string, error)
}

// PrunedReader is implemented by a DispositionReader whose store prunes
// final dispositions (inbox retention): it says which of the events without
// a disposition its retention may have removed.
type PrunedReader interface {
	Pruned(ctx context.Context, events []ExpectedEvent) (map[string]bool, error)
}

// InboxReader reads a consumer's dispositions from its inbox
// (adapters/postgres.Inbox).
type InboxReader struct {
	Inbox    Inbox
	Consumer string
}

var _ DispositionReader = InboxReader{}

// Dispositions implements DispositionReader.
func (r InboxReader) Dispositions(ctx context.Context, ids []string) (map[string][]Disposition, error) {
	recs, err := r.Inbox.Dispositions(ctx, r.Consumer, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]Disposition, len(recs))
	for id, rec := range recs {
		out[id] = []Disposition{{Disposition: string(rec.Disposition), Duplicates: int64(rec.Duplicates), Reason: rec.Reason}}
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

// ConsumerSource names a consumer and its disposition reader.
type ConsumerSource struct {
	Name   string
	Reader DispositionReader
	// RejectedFinal makes `rejected` a final disposition for this consumer
	// (reconcile.consumers[].rejected_final): it declares that an event it
	// cannot apply is, for it, correctly handled. Otherwise a rejected event
	// is unproven, like a parked or held one.
	RejectedFinal bool
}

// ReconcileConfig configures Reconcile.
type ReconcileConfig struct {
	Ledger    Store
	Consumers []ConsumerSource
	// Archive, when set, is searched for inbox event IDs the outbox no
	// longer has (cleaned up), so they are not reported as unknown.
	Archive ArchiveStore
	Cut     CutRequest
	// Cap is how many IDs each discrepancy lists (default 20); counts are
	// always complete.
	Cap int
	// Batch is how many events are matched per round trip (default 5000).
	Batch int
	// Record writes the verified boundary of each clean consumer.
	Record bool
}

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
	// (parked_gap, parked_poison, held; rejected unless the consumer is
	// configured with rejected_final).
	Unproven Class `json:"unproven"`
	// Waiting names, for the first Cap of the unproven events that have a
	// disposition, what it is and the consumer's reason.
	Waiting []WaitingEvent `json:"waiting,omitempty"`
	// Unknown lists event IDs the consumer recorded that the ledger never had.
	Unknown Class `json:"unknown"`
	// MultipleApplied lists event IDs applied more than once (or whose
	// aggregate revision was applied under another event ID too).
	MultipleApplied Class `json:"multiple_applied"`
}

func (d Discrepancies) total() int64 {
	return d.JournalWithoutEvents.Count + d.Unrelayed.Count + d.Unproven.Count + d.Unknown.Count + d.MultipleApplied.Count
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
	Clean     bool             `json:"clean"`
}

// ErrNoConsumers is returned when no consumer is configured.
var ErrNoConsumers = errors.New("no consumers to reconcile")

// Reconcile matches the cut's journals, outbox rows and every consumer's
// dispositions and reports the discrepancies by class. An error means it
// could not run (the report is then incomplete); discrepancies are not
// errors: Report.Clean says whether there were any. With Record, each
// consumer whose report is clean gets its boundary recorded.
func Reconcile(ctx context.Context, cfg ReconcileConfig) (Report, error) {
	if cfg.Cap <= 0 {
		cfg.Cap = 20
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 5000
	}
	if len(cfg.Consumers) == 0 {
		return Report{}, ErrNoConsumers
	}
	cut, err := cfg.Ledger.OpenCut(ctx, cfg.Cut)
	if err != nil {
		return Report{}, err
	}
	defer cut.Close()
	if cut.Floor > 0 && cfg.Archive == nil {
		// The consumers hold event IDs whose outbox rows are gone: without
		// the archive they would all look unknown.
		return Report{}, fmt.Errorf("%w: cleanup removed outbox rows up to journal sequence %d; the archive is needed to tell cleaned events from unknown ones (archive.dir)",
			ErrArchiveRequired, cut.Floor)
	}
	rep := Report{Cut: CutInfo{Sequence: cut.Sequence, LastCommitted: cut.LastCommitted, Floor: cut.Floor,
		TakenAt: cut.TakenAt, WaitedSeconds: cut.Waited.Seconds()}}
	if rep.Cut.CoveredOutboxID, err = cut.CoveredOutboxID(ctx); err != nil {
		return rep, err
	}
	lines, nLines, err := cut.LinesWithoutEvents(ctx, cfg.Cap)
	if err != nil {
		return rep, err
	}
	var journals Class
	seen := map[string]bool{}
	for _, l := range lines {
		if !seen[l.JournalID] {
			seen[l.JournalID] = true
			journals.IDs = append(journals.IDs, l.JournalID)
		}
	}
	journals.Count = nLines // lines; the IDs are their journals

	reps := make([]ConsumerReport, len(cfg.Consumers))
	for i, c := range cfg.Consumers {
		reps[i] = ConsumerReport{Name: c.Name}
		reps[i].Discrepancies.JournalWithoutEvents = journals
	}
	// Coverage already recorded: a disposition pruned since is still proven.
	prev, err := cfg.Ledger.Coverages(ctx)
	if err != nil {
		return rep, err
	}
	var unrelayed Class
	var oldest time.Time
	// byEvent maps an expected event to its report index for the applied-twice check.
	applied := make([]map[string]bool, len(cfg.Consumers))
	for i := range applied {
		applied[i] = map[string]bool{}
	}
	for after := int64(0); ; {
		batch, err := cut.ExpectedEvents(ctx, after, cfg.Batch)
		if err != nil {
			return rep, err
		}
		if len(batch) == 0 {
			break
		}
		after = batch[len(batch)-1].ID
		ids := make([]string, len(batch))
		for i, e := range batch {
			ids[i] = e.EventID
			if !e.Relayed {
				unrelayed.add(cfg.Cap, e.EventID)
				if oldest.IsZero() || e.CreatedAt.Before(oldest) {
					oldest = e.CreatedAt
				}
			}
		}
		for ci, c := range cfg.Consumers {
			disp, err := c.Reader.Dispositions(ctx, ids)
			if err != nil {
				return rep, fmt.Errorf("consumer %s: %w", c.Name, err)
			}
			pruned, err := prunedOf(ctx, c, batch, disp, prev[c.Name].CoveredOutboxID)
			if err != nil {
				return rep, fmt.Errorf("consumer %s: %w", c.Name, err)
			}
			r := &reps[ci]
			for _, e := range batch {
				r.Expected++
				if e.Relayed {
					r.Relayed++
				}
				ds := disp[e.EventID]
				final, nApplied := false, 0
				if pruned[e.EventID] {
					r.Pruned++
					final = true
				}
				var waiting *WaitingEvent
				for _, d := range ds {
					r.DuplicatesAbsorbed += d.Duplicates
					switch d.Disposition {
					case string(core.DispositionApplied):
						nApplied++
						final = true
					case string(core.DispositionDuplicate):
						final = true
					case string(core.DispositionParkedGap), string(core.DispositionParkedPoison):
						// Parked is not covered: the event waits for an
						// operator, and deleting its outbox row would lose
						// what the release needs to re-drive it.
						r.Parked++
						waiting = &WaitingEvent{EventID: e.EventID, Consumer: c.Name, Disposition: d.Disposition, Reason: d.Reason}
					case string(core.DispositionRejected):
						r.Rejected++
						if c.RejectedFinal {
							final = true
						} else {
							waiting = &WaitingEvent{EventID: e.EventID, Consumer: c.Name, Disposition: d.Disposition,
								Reason: d.Reason + " (rejected is final only with reconcile.consumers[].rejected_final)"}
						}
					case string(core.DispositionHeld):
						waiting = &WaitingEvent{EventID: e.EventID, Consumer: c.Name, Disposition: d.Disposition,
							Reason: "held: waiting for its predecessor inside the hold time"}
					}
				}
				if nApplied > 0 {
					r.Applied++
					applied[ci][e.EventID] = true
				}
				if nApplied > 1 {
					r.Discrepancies.MultipleApplied.add(cfg.Cap, e.EventID)
				}
				if !final && (e.Relayed || waiting != nil) {
					r.Discrepancies.Unproven.add(cfg.Cap, e.EventID)
					if waiting != nil && len(r.Discrepancies.Waiting) < cfg.Cap {
						if waiting.Reason == "" {
							waiting.Reason = "(no reason recorded)"
						}
						r.Discrepancies.Waiting = append(r.Discrepancies.Waiting, *waiting)
					}
				}
			}
		}
	}
	if !oldest.IsZero() {
		unrelayed.OldestAgeSeconds = cut.TakenAt.Sub(oldest).Seconds()
	}
	cut.Close() // the rest reads the consumers and the live outbox

	for ci, c := range cfg.Consumers {
		r := &reps[ci]
		r.Discrepancies.Unrelayed = unrelayed
		groups, err := c.Reader.AppliedTwice(ctx)
		if err != nil {
			return rep, fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		for _, g := range groups {
			// Report the group by its event of the cut (the ledger's), or
			// by its first ID when none is.
			id := g[0]
			for _, e := range g {
				if applied[ci][e] {
					id = e
					break
				}
			}
			r.Discrepancies.MultipleApplied.add(cfg.Cap, id)
		}
		unknown, err := unknownEventIDs(ctx, cfg, c.Reader)
		if err != nil {
			return rep, fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		r.Discrepancies.Unknown.add(cfg.Cap, unknown...)
		r.Clean = r.Discrepancies.total() == 0
	}
	rep.Consumers = reps
	rep.Clean = true
	for i := range reps {
		rep.Clean = rep.Clean && reps[i].Clean
		if reps[i].Clean && cfg.Record {
			cov, err := cfg.Ledger.RecordCoverage(ctx, reps[i].Name, rep.Cut.Sequence, rep.Cut.CoveredOutboxID)
			if err != nil {
				return rep, err
			}
			reps[i].Coverage = &cov
		}
	}
	return rep, nil
}

// maxUnknownCandidates bounds the IDs kept for the archive lookup.
const maxUnknownCandidates = 100_000

// unknownEventIDs returns the consumer's event IDs that neither the outbox
// (read now) nor the archive has.
func unknownEventIDs(ctx context.Context, cfg ReconcileConfig, r DispositionReader) ([]string, error) {
	var candidates []string
	err := r.EventIDs(ctx, cfg.Batch, func(ids []string) error {
		u, err := cfg.Ledger.UnknownEventIDs(ctx, ids)
		if err != nil {
			return err
		}
		if len(candidates)+len(u) > maxUnknownCandidates {
			return fmt.Errorf("more than %d event IDs unknown to the outbox: is this the consumer of this ledger?", maxUnknownCandidates)
		}
		candidates = append(candidates, u...)
		return nil
	})
	if err != nil || len(candidates) == 0 || cfg.Archive == nil {
		return candidates, err
	}
	archived, err := ArchivedEventIDs(ctx, cfg.Archive, candidates)
	if err != nil {
		return nil, err
	}
	out := candidates[:0]
	for _, id := range candidates {
		if !archived[id] {
			out = append(out, id)
		}
	}
	return out, nil
}

// prunedOf returns the events of batch that c has no disposition for but
// whose disposition inbox retention removed after an earlier reconciliation
// had proven them: only events at or below c's recorded coverage qualify,
// and only by the rule retention deletes with (PrunedReader). Anything else
// without a disposition stays unproven.
func prunedOf(ctx context.Context, c ConsumerSource, batch []ExpectedEvent, disp map[string][]Disposition, covered int64) (map[string]bool, error) {
	pr, ok := c.Reader.(PrunedReader)
	if !ok || covered <= 0 {
		return nil, nil
	}
	var cands []ExpectedEvent
	for _, e := range batch {
		if e.ID <= covered && len(disp[e.EventID]) == 0 {
			cands = append(cands, e)
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	return pr.Pruned(ctx, cands)
}
