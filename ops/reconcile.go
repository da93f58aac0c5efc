package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/core"
)

// ReconcileConfig configures Reconcile.
type ReconcileConfig struct {
	Ledger Store
	// Consumers are read concurrently, one goroutine per consumer, so
	// their readers (and Ledger) must allow concurrent calls.
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
// consumer's dispositions (matchCut); then find each consumer's unknown
// event IDs and name its events applied twice (finishConsumers); last,
// record the clean consumers' coverage. What does not depend on the cut
// runs beside it: each consumer's applied-twice groups are read from its
// inbox from the start (startAppliedTwice), the consumers are matched and
// finished concurrently, and the next batch is read while one is matched.
// The report does not depend on the order. Memory grows with the cut:
// one 16-byte key per event of the cut and consumer that recorded it.
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
	m, err := newMatching(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer m.stop()
	if rep.Cut.CoveredOutboxID, err = cut.CoveredOutboxID(ctx); err != nil {
		return rep, err
	}
	journals, err := journalsWithoutEvents(ctx, cut, cfg.Cap)
	if err != nil {
		return rep, err
	}
	for i := range m.reps {
		m.reps[i].Discrepancies.JournalWithoutEvents = journals
	}
	if err := m.matchCut(ctx, cut); err != nil {
		return rep, err
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
	// recorded holds, per consumer, the events of the cut it had a
	// disposition for, true if it applied them: for naming an applied-twice
	// group by its event of the cut, and for not asking the outbox about
	// the consumer's event IDs the cut already proved known. Keyed by the
	// 16 bytes of the event ID: a map of a million strings gave the garbage
	// collector more to scan than the matching had to do.
	recorded []map[uuid.UUID]bool
	// prev is the coverage recorded before this run.
	prev      map[string]Coverage
	unrelayed Class
	oldest    time.Time
	// twice holds each consumer's applied-twice groups once twiceRead is
	// done; stop cancels the read and waits for it.
	twice     []appliedTwice
	twiceRead sync.WaitGroup
	stop      func()
}

// appliedTwice is what one consumer's AppliedTwice returned.
type appliedTwice struct {
	groups [][]string
	err    error
}

// newMatching starts the tally of every consumer and the reads of their
// applied-twice groups (call stop when done).
func newMatching(ctx context.Context, cfg ReconcileConfig) (*matching, error) {
	m := &matching{cfg: cfg, reps: make([]ConsumerReport, len(cfg.Consumers)), recorded: make([]map[uuid.UUID]bool, len(cfg.Consumers))}
	for i, c := range cfg.Consumers {
		m.reps[i] = ConsumerReport{Name: c.Name}
		m.recorded[i] = map[uuid.UUID]bool{}
	}
	// Coverage already recorded: a disposition pruned since is still proven.
	var err error
	if m.prev, err = cfg.Ledger.Coverages(ctx); err != nil {
		return nil, err
	}
	m.startAppliedTwice(ctx)
	return m, nil
}

// startAppliedTwice reads every consumer's applied-twice groups in the
// background: a grouping of the whole inbox (seconds on a million rows)
// that needs nothing from the cut, so it overlaps the cut's reads.
func (m *matching) startAppliedTwice(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	m.twice = make([]appliedTwice, len(m.cfg.Consumers))
	for ci, c := range m.cfg.Consumers {
		m.twiceRead.Go(func() {
			m.twice[ci].groups, m.twice[ci].err = c.Reader.AppliedTwice(ctx)
		})
	}
	m.stop = func() {
		cancel()
		m.twiceRead.Wait()
	}
}

// matchCut streams the cut's expected events and matches them batch by
// batch (matchBatch) while the next batch is read. It returns only once the
// read has stopped, so the cut can be closed.
func (m *matching) matchCut(ctx context.Context, cut *Cut) error {
	readCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches, readErr := make(chan []ExpectedEvent, 1), make(chan error, 1)
	go func() {
		defer close(batches)
		readErr <- cut.ExpectedEvents(readCtx, m.cfg.Batch, func(batch []ExpectedEvent) error {
			select {
			case batches <- batch:
				return nil
			case <-readCtx.Done():
				return readCtx.Err()
			}
		})
	}()
	for batch := range batches {
		if err := m.matchBatch(ctx, batch); err != nil {
			cancel()
			for range batches {
			}
			<-readErr
			return err
		}
	}
	return <-readErr
}

// matchBatch tallies one batch of the cut's expected events: the unrelayed
// ones, and for every consumer (concurrently) what it recorded for each.
func (m *matching) matchBatch(ctx context.Context, batch []ExpectedEvent) error {
	ids := make([]string, len(batch))
	keys := make([]uuid.UUID, len(batch))
	for i, e := range batch {
		ids[i] = e.EventID
		var err error
		if keys[i], err = uuid.Parse(e.EventID); err != nil {
			return fmt.Errorf("expected event %d: %w", e.ID, err)
		}
		if !e.Relayed {
			m.unrelayed.add(m.cfg.Cap, e.EventID)
			if m.oldest.IsZero() || e.CreatedAt.Before(m.oldest) {
				m.oldest = e.CreatedAt
			}
		}
	}
	type found struct {
		disp   map[string][]Disposition
		pruned map[string]bool
		err    error
	}
	res := make([]found, len(m.cfg.Consumers))
	var wg sync.WaitGroup
	for ci, c := range m.cfg.Consumers {
		wg.Go(func() {
			f := &res[ci]
			if f.disp, f.err = c.Reader.Dispositions(ctx, ids); f.err == nil {
				f.pruned, f.err = prunedOf(ctx, c, batch, f.disp, m.prev[c.Name].CoveredOutboxID)
			}
		})
	}
	wg.Wait()
	for ci, f := range res {
		if f.err != nil {
			return fmt.Errorf("consumer %s: %w", m.cfg.Consumers[ci].Name, f.err)
		}
		for i, e := range batch {
			m.tally(ci, e, keys[i], f.disp[e.EventID], f.pruned[e.EventID])
		}
	}
	return nil
}

// tally adds what consumer ci recorded for e (key: its event ID; ds;
// pruned: retention removed its proven disposition) to the consumer's
// report.
func (m *matching) tally(ci int, e ExpectedEvent, key uuid.UUID, ds []Disposition, pruned bool) {
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
	if len(ds) > 0 {
		m.recorded[ci][key] = nApplied > 0
	}
	if nApplied > 0 {
		r.Applied++
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
// unrelayed events, the revisions applied twice (read by
// startAppliedTwice) and the unknown event IDs, and whether the report is
// clean. The consumers' inboxes and the outbox are read for every consumer
// concurrently; the archive, last, for one consumer after the other.
func (m *matching) finishConsumers(ctx context.Context) error {
	type finish struct {
		unknown []string
		err     error
	}
	res := make([]finish, len(m.cfg.Consumers))
	var wg sync.WaitGroup
	for ci, c := range m.cfg.Consumers {
		wg.Go(func() {
			res[ci].unknown, res[ci].err = m.unknownToOutbox(ctx, ci, c.Reader)
		})
	}
	wg.Wait()
	m.twiceRead.Wait()
	for ci, c := range m.cfg.Consumers {
		f, r := res[ci], &m.reps[ci]
		if f.err == nil {
			f.err = m.twice[ci].err
		}
		if f.err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, f.err)
		}
		r.Discrepancies.Unrelayed = m.unrelayed
		for _, g := range m.twice[ci].groups {
			// Report the group by its event of the cut (the ledger's), or
			// by its first ID when none is.
			id := g[0]
			for _, e := range g {
				if m.recordedInCut(ci, e, true) {
					id = e
					break
				}
			}
			r.Discrepancies.MultipleApplied.add(m.cfg.Cap, id)
		}
		unknown, err := notArchived(ctx, m.cfg.Archive, f.unknown)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		r.Discrepancies.Unknown.add(m.cfg.Cap, unknown...)
		r.Clean = r.Discrepancies.total() == 0
	}
	return nil
}

// recordedInCut says whether id, exactly as written, is an event of the
// cut consumer ci had a disposition for (with applied, one it applied).
func (m *matching) recordedInCut(ci int, id string, applied bool) bool {
	k, err := uuid.Parse(id)
	if err != nil {
		return false
	}
	a, ok := m.recorded[ci][k]
	// uuid.Parse also reads other spellings; the cut's IDs are canonical.
	return ok && (a || !applied) && k.String() == id
}

// maxUnknownCandidates bounds the IDs kept for the archive lookup.
const maxUnknownCandidates = 100_000

// unknownToOutbox returns consumer ci's event IDs that the outbox, read
// now, does not have. The IDs it had recorded for events of the cut are
// known without asking: only the others (for a consumer that is up to date
// with the cut, hardly any) are looked up.
func (m *matching) unknownToOutbox(ctx context.Context, ci int, r DispositionReader) ([]string, error) {
	var candidates []string
	err := r.EventIDs(ctx, m.cfg.Batch, func(ids []string) error {
		var ask []string
		for _, id := range ids {
			if !m.recordedInCut(ci, id, false) {
				ask = append(ask, id)
			}
		}
		if len(ask) == 0 {
			return nil
		}
		u, err := m.cfg.Ledger.UnknownEventIDs(ctx, ask)
		if err != nil {
			return err
		}
		if len(candidates)+len(u) > maxUnknownCandidates {
			return fmt.Errorf("more than %d event IDs unknown to the outbox: is this the consumer of this ledger?", maxUnknownCandidates)
		}
		candidates = append(candidates, u...)
		return nil
	})
	return candidates, err
}

// notArchived returns those of candidates (event IDs the outbox does not
// have) that the archive, if any, does not have either.
func notArchived(ctx context.Context, archive ArchiveStore, candidates []string) ([]string, error) {
	if len(candidates) == 0 || archive == nil {
		return candidates, nil
	}
	archived, err := ArchivedEventIDs(ctx, archive, candidates)
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
