package ops

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/core"
)

// matching is one reconciliation's tally while it reads the cut.
type matching struct {
	cfg  ReconcileConfig
	reps []ConsumerReport
	// recorded holds, per consumer, the events of the cut it had a
	// disposition for: for naming an applied-twice group by its event of
	// the cut, and for not asking the outbox about the consumer's event IDs
	// the cut already proved known.
	recorded []recordedSet
	// prev is the coverage recorded before this run.
	prev map[string]Coverage
	// oldest is, per consumer, the creation time of its oldest unrelayed
	// row of the cut.
	oldest []time.Time
	// unwatched tallies the cut's rows no consumer subscribes to (route).
	unwatched       Class
	unwatchedTopics map[[2]string]*UnwatchedTopic
	firstUnwatched  int64
	// beforeUnwatched is the id of the cut's last row before the first
	// unwatched event; lastID the last row's routed so far (rows come in
	// id order).
	beforeUnwatched, lastID int64
	// twice holds each consumer's applied-twice groups once twiceRead is
	// done; stop cancels the read and waits for it.
	twice     []appliedTwice
	twiceRead sync.WaitGroup
	stop      func()
	// maxCandidates bounds each consumer's IDs kept for the archive
	// lookup.
	maxCandidates int
	// passes is where each consumer's pass starts (reconcile_marks.go),
	// history the ledger's history its marks are proven against.
	passes  []PassStart
	history string
}

// appliedTwice is what one consumer's AppliedTwice and RevisionConflicts
// returned.
type appliedTwice struct {
	groups    [][]string
	conflicts []RevisionConflict
	err       error
}

// newMatching starts the tally of every consumer and the reads of their
// applied-twice groups (call stop when done).
func newMatching(ctx context.Context, cfg ReconcileConfig, cleanedThroughID int64) (*matching, error) {
	m := &matching{cfg: cfg, reps: make([]ConsumerReport, len(cfg.Consumers)), recorded: make([]recordedSet, len(cfg.Consumers)),
		oldest: make([]time.Time, len(cfg.Consumers)), maxCandidates: int(max(minArchiveCandidates, cleanedThroughID))}
	for i, c := range cfg.Consumers {
		m.reps[i] = ConsumerReport{Name: c.Name}
	}
	// Coverage already recorded: a disposition pruned since is still proven.
	var err error
	if m.prev, err = cfg.Ledger.Coverages(ctx); err != nil {
		return nil, err
	}
	if err := m.beginPasses(ctx); err != nil {
		return nil, err
	}
	m.startAppliedTwice(ctx)
	return m, nil
}

// startAppliedTwice reads every consumer's applied-twice groups in the
// background: a grouping of the whole inbox (seconds on a million rows), or
// of what changed since its mark, that needs nothing from the cut, so it
// overlaps the cut's reads. Its
// revision conflicts (an index scan of one disposition) are read after them.
func (m *matching) startAppliedTwice(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	m.twice = make([]appliedTwice, len(m.cfg.Consumers))
	for ci, c := range m.cfg.Consumers {
		m.twiceRead.Go(func() {
			m.twice[ci].groups, m.twice[ci].err = m.appliedTwice(ctx, ci)
			if m.twice[ci].err == nil {
				m.twice[ci].conflicts, m.twice[ci].err = c.Reader.RevisionConflicts(ctx)
			}
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

// matchBatch tallies one batch of the cut's rows: for every consumer
// (concurrently) what it recorded for each row on its topics, and the rows
// no consumer subscribes to (route).
func (m *matching) matchBatch(ctx context.Context, batch []ExpectedEvent) error {
	keys := make([]uuid.UUID, len(batch))
	for i, e := range batch {
		var err error
		if keys[i], err = uuid.Parse(e.EventID); err != nil {
			return fmt.Errorf("expected event %d: %w", e.ID, err)
		}
	}
	routes := m.route(batch)
	type found struct {
		rows   []ExpectedEvent
		disp   [][]Disposition
		pruned map[string]bool
		err    error
	}
	res := make([]found, len(m.cfg.Consumers))
	var wg sync.WaitGroup
	for ci, c := range m.cfg.Consumers {
		if len(routes[ci]) == 0 {
			continue
		}
		wg.Go(func() {
			f := &res[ci]
			f.rows = make([]ExpectedEvent, len(routes[ci]))
			ids := make([]string, len(routes[ci]))
			for j, i := range routes[ci] {
				f.rows[j], ids[j] = batch[i], batch[i].EventID
			}
			f.disp, f.err = c.Reader.Dispositions(ctx, ids)
			if f.err == nil && len(f.disp) != len(ids) {
				f.err = fmt.Errorf("dispositions: %d answers for %d event IDs", len(f.disp), len(ids))
			}
			if f.err == nil {
				f.pruned, f.err = prunedOf(ctx, c, f.rows, f.disp, m.prev[c.Name].CoveredOutboxID)
			}
		})
	}
	wg.Wait()
	for ci, f := range res {
		if f.err != nil {
			return fmt.Errorf("consumer %s: %w", m.cfg.Consumers[ci].Name, f.err)
		}
		for j, i := range routes[ci] {
			m.tally(ci, batch[i], keys[i], f.disp[j], f.pruned[batch[i].EventID])
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
	} else {
		r.Discrepancies.Unrelayed.add(m.cfg.Cap, e.EventID)
		if m.oldest[ci].IsZero() || e.CreatedAt.Before(m.oldest[ci]) {
			m.oldest[ci] = e.CreatedAt
		}
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
		case string(core.DispositionSkipped):
			// A skip marker: an operator dead-lettered the record and
			// the consumer recorded the gap by name; the record is kept
			// in the ledger's dead_letters table.
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
		case string(core.DispositionRevisionConflict):
			// Not applied: its revision was applied as another event.
			// Never covered (RevisionConflicts names both).
			waiting = &WaitingEvent{EventID: e.EventID, Consumer: c.Name, Disposition: d.Disposition, Reason: d.Reason}
		}
	}
	if len(ds) > 0 {
		m.recorded[ci] = append(m.recorded[ci], recordedEvent{id: key, applied: nApplied > 0})
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

// prunedOf returns the events of batch that c has no disposition for (disp
// is aligned with batch) but whose disposition inbox retention removed
// after an earlier reconciliation had proven them: only events at or below
// c's recorded coverage qualify, and only by the rule retention deletes
// with (PrunedReader). Anything else without a disposition stays unproven.
func prunedOf(ctx context.Context, c ConsumerSource, batch []ExpectedEvent, disp [][]Disposition, covered int64) (map[string]bool, error) {
	pr, ok := c.Reader.(PrunedReader)
	if !ok || covered <= 0 {
		return nil, nil
	}
	var cands []ExpectedEvent
	for i, e := range batch {
		if e.ID <= covered && len(disp[i]) == 0 {
			cands = append(cands, e)
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	return pr.Pruned(ctx, cands)
}
