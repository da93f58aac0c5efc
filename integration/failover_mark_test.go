package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
)

// TestFailoverCheckReadsFromAMarkOnlyWhenTheLedgerHoldsItsWitness is the
// failover check's read from the consumers' reconciliation marks, on a
// real primary with an asynchronous standby. Two clean reconcile passes
// record marks and witnesses; postings follow the second; the primary is
// killed and the standby promoted.
//
//   - The standby replayed the second pass (witnessed): every source is
//     read from its mark, reads fewer events than a whole read, and finds
//     exactly the same lost events: the postings after the pass.
//   - The standby stopped between the passes, so the postings the second
//     pass proved are lost too and the new primary holds the first pass's
//     witness, not the second's: every source is read whole, and the check
//     finds the proven postings lost with the later ones. Negative control:
//     the same sources read from their marks without the witness's proof
//     miss every event of the proven postings.
func TestFailoverCheckReadsFromAMarkOnlyWhenTheLedgerHoldsItsWitness(t *testing.T) {
	t.Parallel()
	for _, witnessed := range []bool{true, false} {
		t.Run(fmt.Sprintf("witnessed=%v", witnessed), func(t *testing.T) {
			t.Parallel()
			failoverFromMarks(t, witnessed)
		})
	}
}

func failoverFromMarks(t *testing.T, witnessed bool) {
	ctx := context.Background()
	f := relaytest.NewFailover(t, pgcluster.Options{})
	consumer := smallConsumerPool(t)
	startOpsConsumers(t, f.Sink, consumer)
	r := &opsRig{ledger: f.Pool, consumer: consumer, store: ledgerstore.New(f.Pool, ledgerstore.Config{}),
		ops: opsstore.New(f.Pool), sink: f.Sink}
	applied := 0
	deliver := func(n int) []core.PostingResult {
		from := len(r.posted)
		applied += r.post(t, n)
		r.relay(t, nil)
		r.waitApplied(t, applied)
		return r.posted[from:]
	}
	pass := func() {
		t.Helper()
		if rep := r.reconcile(t, nil); !rep.Clean {
			t.Fatalf("reconcile is not clean: %+v", rep)
		}
	}
	standbyStops := func() {
		t.Helper()
		waitReplayed(t, f.Pool, f.Standby.URL("ledger"))
		if err := f.Standby.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}

	deliver(30)
	pass()
	if !witnessed {
		standbyStops()
	}
	proven := deliver(10)
	pass()
	if witnessed {
		standbyStops()
	}
	after := deliver(10)
	f.KillPrimaryAndPromote(t)
	pool, err := postgres.Connect(ctx, f.Standby.URL("ledger"), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	sources := []ops.SeenSource{
		opsstore.InboxSeen{Pool: consumer, Consumer: projection.Name},
		opsstore.InboxSeen{Pool: consumer, Consumer: auditlog.Name},
		opsstore.AuditLogSeen{Pool: consumer, Consumer: auditlog.Name},
	}
	check := func(whole bool, sources []ops.SeenSource) ops.FailoverReport {
		t.Helper()
		rep, err := ops.FailoverCheck(ctx, ops.FailoverConfig{Ledger: opsstore.NewFailoverStore(pool), Sources: sources,
			Margin: 1000, Whole: whole})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	fromMarks, whole := check(false, sources), check(true, sources)
	t.Logf("from the marks: %+v; whole: %+v", fromMarks.Sources, whole.Sources)

	want := postingEventIDs(after)
	if !witnessed {
		want = append(want, postingEventIDs(proven)...)
	}
	slices.Sort(want)
	for name, rep := range map[string]ops.FailoverReport{"from the marks": fromMarks, "whole": whole} {
		if got := lostIDs(rep); !slices.Equal(got, want) {
			t.Errorf("read %s: lost %d events, want %d: %v, want %v", name, len(got), len(want), got, want)
		}
	}
	for i, s := range fromMarks.Sources {
		switch {
		case witnessed && (s.SinceMark == 0 || s.Events >= whole.Sources[i].Events):
			t.Errorf("%s: read %d events from mark %d (%s), want fewer than the whole read's %d from a mark",
				s.Name, s.Events, s.SinceMark, s.WholeBecause, whole.Sources[i].Events)
		case !witnessed && (s.SinceMark != 0 || !strings.Contains(s.WholeBecause, "witness")):
			t.Errorf("%s: read from mark %d (%q), want whole for want of the witness", s.Name, s.SinceMark, s.WholeBecause)
		}
	}
	if witnessed {
		return
	}

	// Negative control: the marks trusted without their witness.
	trusted := make([]ops.SeenSource, len(sources))
	for i, s := range sources {
		trusted[i] = trustedMark{t: t, src: s.(ops.MarkedSource)}
	}
	missed := lostIDs(check(false, trusted))
	for _, id := range postingEventIDs(proven) {
		if _, found := slices.BinarySearch(missed, id); found {
			t.Errorf("control: event %s of a proven posting was found lost from the marks without the witness: the control does not bite", id)
		}
	}
	if len(missed) != len(postingEventIDs(after)) {
		t.Errorf("control: %d lost events, want the %d of the postings after the pass", len(missed), len(postingEventIDs(after)))
	}
	t.Logf("control: read from the marks without the witness, the check found %d lost events and missed the %d of the postings the second pass proved",
		len(missed), len(postingEventIDs(proven)))
}

// trustedMark reads a source from its mark without asking the ledger for
// the mark's witness: the failover check as it would be without it.
type trustedMark struct {
	t   *testing.T
	src ops.MarkedSource
}

func (s trustedMark) SourceName() string { return s.src.SourceName() }

func (s trustedMark) Seen(ctx context.Context, each func([]ops.SeenEvent) error) error {
	m, err := s.src.SeenMark(ctx)
	if err != nil {
		return err
	}
	if m.Since == 0 {
		s.t.Fatalf("%s has no mark: %s", s.SourceName(), m.Why)
	}
	return s.src.SeenSince(ctx, m.Since, each)
}

// waitReplayed waits until the standby at standbyURL replayed the WAL the
// primary has written so far.
func waitReplayed(t *testing.T, primary *pgxpool.Pool, standbyURL string) {
	t.Helper()
	ctx := context.Background()
	standby, err := postgres.Connect(ctx, standbyURL, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	var lsn string
	if err := primary.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the standby replayed "+lsn, func() bool {
		var done bool
		if err := standby.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done
	})
}

func postingEventIDs(posted []core.PostingResult) []string {
	var ids []string
	for _, p := range posted {
		for _, e := range p.Events {
			ids = append(ids, e.EventID)
		}
	}
	return ids
}

// lostIDs are the IDs of the events rep found lost, sorted.
func lostIDs(rep ops.FailoverReport) []string {
	ids := map[string]bool{}
	for _, l := range rep.Lost {
		ids[l.EventID] = true
	}
	return slices.Sorted(maps.Keys(ids))
}
