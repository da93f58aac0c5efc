package integration

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/ops"
)

// A clean run records the boundary; then every discrepancy class is
// produced on purpose by tampering with rows and reported with its IDs,
// and the boundary does not move. The tampered run reads the consumers'
// histories from the clean run's marks, which proved the event of the
// outbox row removed by hand known then, so only a full pass names it
// unknown again (the cut's journal check names it in both), unless its
// inbox row was written at or after the mark (changedSince).
func TestOpsReconcileCleanThenEveryDiscrepancyClass(t *testing.T) {
	t.Parallel()

	r := newOpsRig(t)
	events := r.deliver(t, 30)

	rep := r.reconcile(t, nil)
	if !rep.Clean {
		t.Fatalf("untouched run not clean: %+v", rep)
	}
	lastSeq := r.posted[len(r.posted)-1].Sequence
	if rep.Cut.Sequence != lastSeq {
		t.Fatalf("cut %d, want the last committed sequence %d", rep.Cut.Sequence, lastSeq)
	}
	for _, c := range rep.Consumers {
		if c.Expected != int64(events) || c.Relayed != int64(events) || c.Applied != int64(events) || c.Coverage == nil {
			t.Fatalf("%s: %+v, want %d expected, relayed and applied, and coverage recorded", c.Name, c, events)
		}
		if c.Coverage.CutSequence != lastSeq || c.Coverage.CoveredOutboxID != rep.Cut.CoveredOutboxID {
			t.Fatalf("%s coverage %+v, want cut %d covered id %d", c.Name, c.Coverage, lastSeq, rep.Cut.CoveredOutboxID)
		}
		if c.Pass == nil || c.Pass.SinceMark != 0 || c.Pass.RecordedMark == 0 {
			t.Fatalf("%s: first pass %+v, want a full one that records a mark", c.Name, c.Pass)
		}
	}
	maxID := r.count(t, `SELECT max(id) FROM outbox`)
	if rep.Cut.CoveredOutboxID != maxID {
		t.Fatalf("covered outbox id %d, want %d (every row belongs to the cut)", rep.Cut.CoveredOutboxID, maxID)
	}
	covered := coverageRows(t, r)

	// The tampering: one change per class.
	first, second, third := r.posted[3], r.posted[7], r.posted[11]
	// Journal without its events: the outbox row of one line is gone.
	missing := first.Events[0].EventID
	mustExec(t, r.ledger, `DELETE FROM outbox WHERE event_id = $1`, missing)
	// Unrelayed: a marker is gone.
	unrelayed := second.Events[1].EventID
	mustExec(t, r.ledger, `INSERT INTO outbox_pending (shard, id) SELECT shard, id FROM outbox WHERE event_id = $1`, unrelayed)
	// Unproven: the projection has no disposition for an event.
	unproven := third.Events[0].EventID
	mustExec(t, r.consumer, `DELETE FROM consumer_inbox WHERE consumer = $1 AND event_id = $2`, projection.Name, unproven)
	// Unknown: the audit log recorded an event ID the ledger never had.
	stranger := uuid.Must(uuid.NewV7()).String()
	mustExec(t, r.consumer, `INSERT INTO consumer_inbox (consumer, event_id, disposition) VALUES ($1, $2, 'rejected')`, auditlog.Name, stranger)
	// More than one applied: the audit log applied an account revision a
	// second time under another event ID.
	twice := r.posted[15].Events[1]
	forged := uuid.Must(uuid.NewV7()).String()
	mustExec(t, r.consumer, `
INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
SELECT consumer, $3, kind, type, aggregate_type, aggregate_id, revision, 'applied' FROM consumer_inbox
WHERE consumer = $1 AND event_id = $2`, auditlog.Name, twice.EventID, forged)

	for _, full := range []bool{false, true} {
		rep, err := ops.Reconcile(context.Background(), ops.ReconcileConfig{Ledger: r.ops, Consumers: r.sources(), Record: true, Full: full})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Clean {
			t.Fatalf("tampered run (full %v) reported clean", full)
		}
		proj, audit := consumerReport(t, rep, projection.Name), consumerReport(t, rep, auditlog.Name)
		for _, c := range []ops.ConsumerReport{proj, audit} {
			if c.Clean || c.Coverage != nil {
				t.Fatalf("%s: clean %v, coverage %+v; want neither", c.Name, c.Clean, c.Coverage)
			}
			if fromMark := c.Pass.SinceMark > 0; fromMark == full || c.Pass.RecordedMark != 0 {
				t.Fatalf("%s, full %v: pass %+v", c.Name, full, *c.Pass)
			}
			assertClass(t, c.Name+" journal without events", c.Discrepancies.JournalWithoutEvents, first.JournalID)
			assertClass(t, c.Name+" unrelayed", c.Discrepancies.Unrelayed, unrelayed)
			if c.Discrepancies.Unrelayed.OldestAgeSeconds <= 0 {
				t.Errorf("%s unrelayed has no age", c.Name)
			}
		}
		assertClass(t, "projection unproven", proj.Discrepancies.Unproven, unproven)
		assertClass(t, "audit unproven", audit.Discrepancies.Unproven)
		// The deleted outbox row's event is known to both consumers but not
		// to the ledger any more: unknown, like the stranger, to a full pass,
		// and to a pass from the mark only if its inbox row changed at or
		// after the mark. The mark is the oldest transaction running when
		// the clean pass began, on the whole server: while other sessions'
		// transactions run (other tests' in CI), it lies below rows written
		// before the pass, which are then read again.
		projMissing, auditMissing := []string{missing}, []string{missing, stranger, forged}
		if !full {
			if changedSince(t, r, projection.Name, missing, proj.Pass.SinceMark) {
				t.Logf("projection's row of %s changed after the mark %d: read again", missing, proj.Pass.SinceMark)
			} else {
				projMissing = nil
			}
			if !changedSince(t, r, auditlog.Name, missing, audit.Pass.SinceMark) {
				auditMissing = auditMissing[1:]
			}
		}
		assertClass(t, "projection unknown", proj.Discrepancies.Unknown, projMissing...)
		assertClass(t, "audit unknown", audit.Discrepancies.Unknown, auditMissing...)
		assertClass(t, "projection multiple applied", proj.Discrepancies.MultipleApplied)
		assertClass(t, "audit multiple applied", audit.Discrepancies.MultipleApplied, twice.EventID)
		if after := coverageRows(t, r); !equalCoverage(after, covered) {
			t.Fatalf("coverage moved on a run with discrepancies: %v → %v", covered, after)
		}
	}
}

// changedSince reports whether consumer's inbox row of eventID was last
// written by a transaction at or after mark.
func changedSince(t *testing.T, r *opsRig, consumer, eventID string, mark uint64) bool {
	t.Helper()
	var changed int64
	if err := r.consumer.QueryRow(context.Background(),
		`SELECT changed_xid::text::bigint FROM consumer_inbox WHERE consumer = $1 AND event_id = $2`,
		consumer, eventID).Scan(&changed); err != nil {
		t.Fatal(err)
	}
	return uint64(changed) >= mark
}

// A cut beyond the last committed sequence cannot be proven: reconcile
// refuses to run rather than report a partial truth.
func TestOpsReconcileRefusesCutBeyondCommitted(t *testing.T) {
	t.Parallel()
	r := newOpsRig(t)
	r.post(t, 2)
	_, err := ops.Reconcile(context.Background(), ops.ReconcileConfig{Ledger: r.ops, Consumers: r.sources(),
		Cut: ops.CutRequest{Sequence: r.posted[1].Sequence + 5}})
	if err == nil || !errors.Is(err, ops.ErrCutNotProvable) {
		t.Fatalf("err %v, want ErrCutNotProvable", err)
	}
}

func consumerReport(t *testing.T, rep ops.Report, name string) ops.ConsumerReport {
	t.Helper()
	for _, c := range rep.Consumers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no report for %s", name)
	return ops.ConsumerReport{}
}

func assertClass(t *testing.T, what string, c ops.Class, want ...string) {
	t.Helper()
	got := slices.Clone(c.IDs)
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if c.Count < int64(len(want)) || !slices.Equal(got, want) {
		t.Errorf("%s: count %d ids %v, want ids %v", what, c.Count, got, want)
	}
}

func coverageRows(t *testing.T, r *opsRig) map[string]ops.Coverage {
	t.Helper()
	c, err := r.ops.Coverages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func equalCoverage(a, b map[string]ops.Coverage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w := b[k]; !v.VerifiedAt.Equal(w.VerifiedAt) || v.CutSequence != w.CutSequence || v.CoveredOutboxID != w.CoveredOutboxID {
			return false
		}
	}
	return true
}

// Held and rejected events are unproven with their reasons; rejected is
// final only for a consumer configured with rejected_final.
func TestOpsReconcileHeldAndRejectedAreUnproven(t *testing.T) {
	t.Parallel()
	r := newOpsRig(t)
	r.deliver(t, 6)
	held, rejected := r.posted[1].Events[0].EventID, r.posted[4].Events[1].EventID
	mustExec(t, r.consumer, `UPDATE consumer_inbox SET disposition = 'held', held_since = now() WHERE consumer = $1 AND event_id = $2`, projection.Name, held)
	mustExec(t, r.consumer, `UPDATE consumer_inbox SET disposition = 'rejected', reason = 'no handler for it' WHERE consumer = $1 AND event_id = $2`, auditlog.Name, rejected)

	rep := r.reconcile(t, nil)
	proj, audit := consumerReport(t, rep, projection.Name), consumerReport(t, rep, auditlog.Name)
	if rep.Clean || proj.Coverage != nil || audit.Coverage != nil {
		t.Fatalf("held/rejected run: clean %v, coverage %+v %+v", rep.Clean, proj.Coverage, audit.Coverage)
	}
	assertClass(t, "projection unproven", proj.Discrepancies.Unproven, held)
	assertClass(t, "audit unproven", audit.Discrepancies.Unproven, rejected)
	if w := proj.Discrepancies.Waiting; len(w) != 1 || w[0].Disposition != "held" || w[0].EventID != held {
		t.Fatalf("projection waiting %+v", w)
	}
	if w := audit.Discrepancies.Waiting; len(w) != 1 || w[0].Disposition != "rejected" || !strings.Contains(w[0].Reason, "no handler for it") {
		t.Fatalf("audit waiting %+v", w)
	}

	// The audit log declares rejected final: it is covered, the projection
	// still is not.
	srcs := r.sources()
	for i := range srcs {
		srcs[i].RejectedFinal = srcs[i].Name == auditlog.Name
	}
	rep, err := ops.Reconcile(context.Background(), ops.ReconcileConfig{Ledger: r.ops, Consumers: srcs, Record: true})
	if err != nil {
		t.Fatal(err)
	}
	proj, audit = consumerReport(t, rep, projection.Name), consumerReport(t, rep, auditlog.Name)
	if !audit.Clean || audit.Coverage == nil || proj.Clean || proj.Coverage != nil {
		t.Fatalf("with rejected_final on the audit log: audit %+v; projection %+v", audit, proj)
	}
}
