package ops

import (
	"context"
	"fmt"
)

// Two of reconciliation's checks look at everything a consumer ever
// recorded, not at the cut: that the ledger knows every event ID the
// consumer holds, and that no revision was applied twice. On a long history
// their cost is the whole inbox's (and, once cleanup has removed the outbox
// rows, the archive's). A consumer whose reader is an IncrementalReader
// reads for them only what changed since its last clean pass: a clean pass
// records a mark taken before it read, below which every change was read
// and proven, and the next pass reads the changes at or after it.
//
// What a pass from a mark does not do again: prove that an event the ledger
// knew then is still known. The ledger loses outbox rows only to cleanup,
// which archives them first; a row removed by hand is found by the cut's
// journal check when it was a journal's, and otherwise only by a full pass
// (ReconcileConfig.Full). After a failover the ledger's history differs
// from the mark's and the pass is full.

// IncrementalReader is implemented by a DispositionReader that can read
// only what changed after a mark (InboxReader does).
type IncrementalReader interface {
	// BeginPass starts a pass proven against ledgerHistory: it returns the
	// mark this pass records if it is clean, and the recorded mark it may
	// read from.
	BeginPass(ctx context.Context, ledgerHistory string) (PassStart, error)
	// EventIDsSince is EventIDs for the records changed at or after since.
	EventIDsSince(ctx context.Context, since uint64, batch int, fn func(ids []string) error) error
	// AppliedTwiceSince is AppliedTwice for the groups that hold a record
	// changed at or after since.
	AppliedTwiceSince(ctx context.Context, since uint64) ([][]string, error)
	// RecordMark records mark (a PassStart.Next) as where the next pass
	// proven against ledgerHistory may start, with the witness the pass
	// recorded with the consumer's coverage on the ledger (Coverage.Witness).
	RecordMark(ctx context.Context, mark uint64, ledgerHistory, witness string) error
}

// PassStart is where one consumer's pass starts.
type PassStart struct {
	// Next is the mark a clean pass starting now records: in the inbox's
	// database, the oldest transaction still running when the pass began.
	// Every one below it had ended, so the pass reads all their changes.
	Next uint64
	// Since is the recorded mark the pass may read from; 0 when there is
	// none it may use, and then Why says why.
	Since uint64
	Why   string
}

// PassInfo says how a consumer's pass read its whole-history checks.
type PassInfo struct {
	// SinceMark is the mark the pass read from: only records changed at or
	// after it were checked for unknown event IDs and revisions applied
	// twice, the rest having been proven by the pass that recorded it. 0:
	// a full pass, for the reason in FullBecause.
	SinceMark   uint64 `json:"since_mark"`
	FullBecause string `json:"full_because,omitempty"`
	// RecordedMark is the mark this pass recorded for the next (0: none).
	RecordedMark uint64 `json:"recorded_mark"`
}

// beginPasses starts the pass of every consumer whose reader is an
// IncrementalReader, before anything of its inbox is read; the others (and
// all with cfg.Full) read everything.
func (m *matching) beginPasses(ctx context.Context) error {
	m.passes = make([]PassStart, len(m.cfg.Consumers))
	for ci, c := range m.cfg.Consumers {
		ir, ok := c.Reader.(IncrementalReader)
		if !ok {
			continue
		}
		if m.history == "" {
			h, err := m.cfg.Ledger.LedgerHistory(ctx)
			if err != nil {
				return err
			}
			m.history = h
		}
		p, err := ir.BeginPass(ctx, m.history)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		if m.cfg.Full && p.Since > 0 {
			p.Since, p.Why = 0, "a full pass was asked for"
		}
		m.passes[ci] = p
		m.reps[ci].Pass = &PassInfo{SinceMark: p.Since, FullBecause: p.Why}
	}
	return nil
}

// eventIDs reads consumer ci's event IDs for the unknown-ID check: those
// changed since its mark, or all of them.
func (m *matching) eventIDs(ctx context.Context, ci int, fn func([]string) error) error {
	r := m.cfg.Consumers[ci].Reader
	if since := m.passes[ci].Since; since > 0 {
		return r.(IncrementalReader).EventIDsSince(ctx, since, m.cfg.Batch, fn)
	}
	return r.EventIDs(ctx, m.cfg.Batch, fn)
}

// appliedTwice reads consumer ci's applied-twice groups: those with a
// record changed since its mark, or all of them.
func (m *matching) appliedTwice(ctx context.Context, ci int) ([][]string, error) {
	r := m.cfg.Consumers[ci].Reader
	if since := m.passes[ci].Since; since > 0 {
		return r.(IncrementalReader).AppliedTwiceSince(ctx, since)
	}
	return r.AppliedTwice(ctx)
}

// recordMark records, for consumer ci whose pass was clean, the mark its
// pass started at.
func (m *matching) recordMark(ctx context.Context, ci int, r *ConsumerReport) error {
	ir, ok := m.cfg.Consumers[ci].Reader.(IncrementalReader)
	if !ok || m.passes[ci].Next == 0 {
		return nil
	}
	if err := ir.RecordMark(ctx, m.passes[ci].Next, m.history, r.Coverage.Witness); err != nil {
		return fmt.Errorf("consumer %s: record the mark of its pass: %w", r.Name, err)
	}
	r.Pass.RecordedMark = m.passes[ci].Next
	return nil
}
