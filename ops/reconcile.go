package ops

import (
	"context"
	"errors"
	"fmt"
)

// ReconcileConfig configures Reconcile.
type ReconcileConfig struct {
	Ledger ReconcileStore
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
	// Record writes the verified boundary of each clean consumer, and the
	// mark its next pass may start from (reconcile_marks.go).
	Record bool
	// Full reads every consumer's whole history for the checks that a
	// recorded mark would otherwise limit to what changed since.
	Full bool
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
// event IDs and name its events applied twice and its revision conflicts,
// each with both event IDs (finishConsumers); last,
// record the clean consumers' coverage and marks. The checks over a
// consumer's whole history (unknown event IDs, revisions applied twice)
// read only what changed since the mark of its last clean pass when it
// has a usable one (reconcile_marks.go). What does not depend on the cut
// runs beside it: each consumer's applied-twice groups are read from its
// inbox (startAppliedTwice), the consumers are matched and
// finished concurrently, and the next batch is read while one is matched.
// The report does not depend on the order. Memory grows with the cut:
// 17 bytes per event of the cut and consumer that recorded it; and with
// what cleanup removed that the consumers still hold: 16 bytes per such
// event ID of each consumer, until its inbox retention prunes them.
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
	if (cut.Floor > 0 || cut.CleanedThroughID > 0) && cfg.Archive == nil {
		// The consumers hold event IDs whose outbox rows are gone: without
		// the archive they would all look unknown.
		return Report{}, fmt.Errorf("%w: cleanup removed outbox rows up to journal sequence %d and outbox id %d; the archive is needed to tell cleaned events from unknown ones (archive.dir)",
			ErrArchiveRequired, cut.Floor, cut.CleanedThroughID)
	}
	rep := Report{Cut: CutInfo{Sequence: cut.Sequence, LastCommitted: cut.LastCommitted, Floor: cut.Floor,
		TakenAt: cut.TakenAt, WaitedSeconds: cut.Waited.Seconds()}}
	m, err := newMatching(ctx, cfg, cut.CleanedThroughID)
	if err != nil {
		return rep, err
	}
	defer m.stop()
	proofCtx, cancelProof := context.WithCancel(ctx)
	proof, err := startLedgerProof(proofCtx, cut, cfg)
	if err != nil {
		cancelProof()
		return rep, err
	}
	defer func() {
		cancelProof()
		_ = proof.wait()
	}()
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
	for ci, t := range m.oldest {
		if !t.IsZero() {
			m.reps[ci].Discrepancies.Unrelayed.OldestAgeSeconds = cut.TakenAt.Sub(t).Seconds()
		}
	}
	cut.Close() // the rest reads the consumers and the live outbox

	if err := m.finishConsumers(ctx); err != nil {
		return rep, err
	}
	if err := proof.wait(); err != nil {
		return rep, err
	}
	rep.Ledger = proof.proof
	for ci := range m.reps {
		if v := proof.views[ci]; v != nil {
			m.reps[ci].BalanceView = v
			m.reps[ci].Clean = m.reps[ci].Clean && v.Mismatch.Count == 0
		}
	}
	rep.Unwatched, rep.UnwatchedTopics = m.unwatched, m.unwatchedList()
	if m.firstUnwatched > 0 {
		rep.Cut.CoveredOutboxID = min(rep.Cut.CoveredOutboxID, m.beforeUnwatched)
	}
	rep.Consumers = m.reps
	err = m.recordClean(ctx, &rep)
	return rep, err
}

// recordClean sets rep.Clean and, with Record, records the boundary and
// the mark of every clean consumer, unless the ledger itself disagrees with
// its journal: then nothing is recorded.
func (m *matching) recordClean(ctx context.Context, rep *Report) error {
	ledgerClean := rep.Ledger.Clean()
	rep.Clean = ledgerClean && rep.Unwatched.Count == 0
	for i := range rep.Consumers {
		r := &rep.Consumers[i]
		rep.Clean = rep.Clean && r.Clean
		if r.Clean && ledgerClean && m.cfg.Record {
			cov, err := m.cfg.Ledger.RecordCoverage(ctx, r.Name, rep.Cut.Sequence, rep.Cut.CoveredOutboxID)
			if err != nil {
				return err
			}
			r.Coverage = &cov
			if err := m.recordMark(ctx, i, r); err != nil {
				return err
			}
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
