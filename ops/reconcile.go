package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/posthorn/posthorn/core"
)

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
//
// The steps: open a provable cut; find the journal lines without events;
// match the cut's expected events, batch by batch, against every
// consumer's dispositions (matchBatch); then, outside the cut, find each
// consumer's events applied twice and its unknown event IDs
// (finishConsumers); last, record the clean consumers' coverage.
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
	journals, err := journalsWithoutEvents(ctx, cut, cfg.Cap)
	if err != nil {
		return rep, err
	}
	m, err := newMatching(ctx, cfg, journals)
	if err != nil {
		return rep, err
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
		if err := m.matchBatch(ctx, batch); err != nil {
			return rep, err
		}
	}
	if !m.oldest.IsZero() {
		m.unrelayed.OldestAgeSeconds = cut.TakenAt.Sub(m.oldest).Seconds()
	}
	cut.Close() // the rest reads the consumers and the live outbox

	if err := m.finishConsumers(ctx); err != nil {
		return rep, err
	}
	rep.Consumers = m.reps
	err = recordClean(ctx, cfg, &rep)
	return rep, err
}

// recordClean sets rep.Clean and, with cfg.Record, records the boundary of
// every clean consumer.
func recordClean(ctx context.Context, cfg ReconcileConfig, rep *Report) error {
	rep.Clean = true
	for i := range rep.Consumers {
		r := &rep.Consumers[i]
		rep.Clean = rep.Clean && r.Clean
		if r.Clean && cfg.Record {
			cov, err := cfg.Ledger.RecordCoverage(ctx, r.Name, rep.Cut.Sequence, rep.Cut.CoveredOutboxID)
			if err != nil {
				return err
			}
			r.Coverage = &cov
		}
	}
	return nil
}

// journalsWithoutEvents is the class of the cut's journal lines without
// their event: the count is of lines, the IDs are of their journals.
func journalsWithoutEvents(ctx context.Context, cut *Cut, limit int) (Class, error) {
	lines, nLines, err := cut.LinesWithoutEvents(ctx, limit)
	if err != nil {
		return Class{}, err
	}
	var journals Class
	seen := map[string]bool{}
	for _, l := range lines {
		if !seen[l.JournalID] {
			seen[l.JournalID] = true
			journals.IDs = append(journals.IDs, l.JournalID)
		}
	}
	journals.Count = nLines
	return journals, nil
}

// matching is one reconciliation's tally while it reads the cut.
type matching struct {
	cfg  ReconcileConfig
	reps []ConsumerReport
	// applied holds, per consumer, the events of the cut it applied, for
	// naming an applied-twice group by its event of the cut.
	applied []map[string]bool
	// prev is the coverage recorded before this run.
	prev      map[string]Coverage
	unrelayed Class
	oldest    time.Time
}

// newMatching starts the tally of every consumer with the cut's journals
// without events.
func newMatching(ctx context.Context, cfg ReconcileConfig, journals Class) (*matching, error) {
	m := &matching{cfg: cfg, reps: make([]ConsumerReport, len(cfg.Consumers)), applied: make([]map[string]bool, len(cfg.Consumers))}
	for i, c := range cfg.Consumers {
		m.reps[i] = ConsumerReport{Name: c.Name}
		m.reps[i].Discrepancies.JournalWithoutEvents = journals
		m.applied[i] = map[string]bool{}
	}
	// Coverage already recorded: a disposition pruned since is still proven.
	var err error
	if m.prev, err = cfg.Ledger.Coverages(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// matchBatch tallies one batch of the cut's expected events: the unrelayed
// ones, and for every consumer what it recorded for each.
func (m *matching) matchBatch(ctx context.Context, batch []ExpectedEvent) error {
	ids := make([]string, len(batch))
	for i, e := range batch {
		ids[i] = e.EventID
		if !e.Relayed {
			m.unrelayed.add(m.cfg.Cap, e.EventID)
			if m.oldest.IsZero() || e.CreatedAt.Before(m.oldest) {
				m.oldest = e.CreatedAt
			}
		}
	}
	for ci, c := range m.cfg.Consumers {
		disp, err := c.Reader.Dispositions(ctx, ids)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		pruned, err := prunedOf(ctx, c, batch, disp, m.prev[c.Name].CoveredOutboxID)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		for _, e := range batch {
			m.tally(ci, e, disp[e.EventID], pruned[e.EventID])
		}
	}
	return nil
}

// tally adds what consumer ci recorded for e (ds; pruned: retention removed
// its proven disposition) to the consumer's report.
func (m *matching) tally(ci int, e ExpectedEvent, ds []Disposition, pruned bool) {
	c, r := m.cfg.Consumers[ci], &m.reps[ci]
	r.Expected++
	if e.Relayed {
		r.Relayed++
	}
	final, nApplied := false, 0
	if pruned {
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
		m.applied[ci][e.EventID] = true
	}
	if nApplied > 1 {
		r.Discrepancies.MultipleApplied.add(m.cfg.Cap, e.EventID)
	}
	if !final && (e.Relayed || waiting != nil) {
		r.Discrepancies.Unproven.add(m.cfg.Cap, e.EventID)
		if waiting != nil && len(r.Discrepancies.Waiting) < m.cfg.Cap {
			if waiting.Reason == "" {
				waiting.Reason = "(no reason recorded)"
			}
			r.Discrepancies.Waiting = append(r.Discrepancies.Waiting, *waiting)
		}
	}
}

// finishConsumers completes every consumer's report outside the cut: the
// unrelayed events, the revisions applied twice and the unknown event IDs,
// and whether the report is clean.
func (m *matching) finishConsumers(ctx context.Context) error {
	for ci, c := range m.cfg.Consumers {
		r := &m.reps[ci]
		r.Discrepancies.Unrelayed = m.unrelayed
		groups, err := c.Reader.AppliedTwice(ctx)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		for _, g := range groups {
			// Report the group by its event of the cut (the ledger's), or
			// by its first ID when none is.
			id := g[0]
			for _, e := range g {
				if m.applied[ci][e] {
					id = e
					break
				}
			}
			r.Discrepancies.MultipleApplied.add(m.cfg.Cap, id)
		}
		unknown, err := unknownEventIDs(ctx, m.cfg, c.Reader)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		r.Discrepancies.Unknown.add(m.cfg.Cap, unknown...)
		r.Clean = r.Discrepancies.total() == 0
	}
	return nil
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
