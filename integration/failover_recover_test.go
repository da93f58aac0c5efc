package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
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
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
)

// TestFailoverRecoverRebuildsLostPostings is a ledger failover with the
// real pieces: a primary with an asynchronous standby, the Posting API's
// store, the relay and both example consumers on the memory sink. The
// standby is shut down, postings commit on the primary and are published
// and applied, the primary is killed and the standby promoted: those
// postings are lost. failover check names every lost event by ID with its
// journal, account, revision and amount; recover --dry-run writes
// nothing; recover re-commits the lost postings with their journal IDs,
// event IDs and revisions (GET by journal returns them; the ledger's
// balances equal the projection's), moves the sequences and revisions, and
// accepts the history; a second recover has nothing to do; new postings
// then take fresh outbox ids, journal sequences and revisions, and no
// consumer records a revision_conflict. Negative control: without the
// recovery, new postings reuse the lost events' revisions (both consumers
// record revision_conflicts), outbox ids are reissued, and a check afterwards names the lost postings it can no
// longer rebuild where they were.
func TestFailoverRecoverRebuildsLostPostings(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"polling", "cdc"} {
		for _, recover := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/recover=%v", mode, recover), func(t *testing.T) {
				t.Parallel()
				failoverRecover(t, mode == "cdc", recover)
			})
		}
	}
}

// ledgerState is what a dry run must leave as it was.
type ledgerState struct {
	outbox, journals, lines, revisions, outboxSeq, journalSeq, timelines, lost int64
}

func readLedgerState(t *testing.T, pool *pgxpool.Pool) ledgerState {
	t.Helper()
	var s ledgerState
	err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM journals),
    (SELECT count(*) FROM journal_lines), (SELECT coalesce(sum(revision), 0) FROM accounts),
    (SELECT last_value FROM outbox_id_seq), (SELECT last_value FROM journal_sequence),
    (SELECT count(*) FROM posthorn.ledger_timelines), (SELECT count(*) FROM posthorn.failover_lost)`).
		Scan(&s.outbox, &s.journals, &s.lines, &s.revisions, &s.outboxSeq, &s.journalSeq, &s.timelines, &s.lost)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func failoverRecover(t *testing.T, cdcMode, recover bool) {
	ctx := context.Background()
	f := relaytest.NewFailover(t, pgcluster.Options{Logical: cdcMode})
	consumer := smallConsumerPool(t)
	startOpsConsumers(t, f.Sink, consumer)
	r := &opsRig{ledger: f.Pool, consumer: consumer, store: ledgerstore.New(f.Pool, ledgerstore.Config{}),
		ops: opsstore.New(f.Pool), sink: f.Sink, cdc: cdcMode}
	before := r.deliver(t, 6)

	// The standby stops; what commits now reaches the world but not it.
	if err := f.Standby.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	lostFrom := len(r.posted)
	// More than 32 outbox rows: PostgreSQL logs a sequence 32 values ahead,
	// so a shorter lost tail would not reach the ids the standby resumes at.
	events := r.post(t, 20)
	r.relay(t, nil)
	r.waitApplied(t, before+events)
	lostPostings := r.posted[lostFrom:]
	var oldOutboxID, oldJournalSeq int64
	if err := f.Pool.QueryRow(ctx, `SELECT (SELECT max(id) FROM outbox), (SELECT max(sequence) FROM journals)`).
		Scan(&oldOutboxID, &oldJournalSeq); err != nil {
		t.Fatal(err)
	}
	f.KillPrimaryAndPromote(t)
	pool, err := postgres.Connect(ctx, f.Standby.URL("ledger"), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	nr := &opsRig{ledger: pool, consumer: consumer, store: ledgerstore.New(pool, ledgerstore.Config{}),
		ops: opsstore.New(pool), sink: f.Sink, n: r.n, cdc: cdcMode}
	// The relay's and the API's check (every new connection reads the
	// history) refuses the promoted standby's new timeline.
	_, watch := watchedPool(t, f.Standby.URL("ledger"))
	if err := watch.Check(ctx); !errors.Is(err, postgres.ErrHistoryNotAccepted) {
		t.Fatalf("the history check after the promotion: %v, want ErrHistoryNotAccepted", err)
	} else {
		t.Logf("after the promotion the relay and the API hold: %v", err)
	}

	// What the world has and the new primary lacks: every event of the
	// lost postings, with its journal and amount.
	type want struct {
		journal, account, delta string
		revision                int64
	}
	wantLost := map[string]want{}
	for k, p := range lostPostings {
		amount := 100 + lostFrom + k // opsRig.post: entry 0 debits, entry 1 credits this much
		for i, e := range p.Events {
			d := strconv.Itoa(amount)
			if i == 0 {
				d = "-" + d
			}
			wantLost[e.EventID] = want{journal: p.JournalID, account: e.Account, delta: d, revision: e.Revision}
		}
	}
	cfg := ops.FailoverConfig{Ledger: opsstore.NewFailoverStore(pool), Margin: 1000, Sources: []ops.SeenSource{
		opsstore.InboxSeen{Pool: consumer, Consumer: projection.Name},
		opsstore.InboxSeen{Pool: consumer, Consumer: auditlog.Name},
		opsstore.AuditLogSeen{Pool: consumer, Consumer: auditlog.Name},
	}}
	rep, err := ops.FailoverCheck(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	gotLost := map[string]ops.LostEvent{}
	for _, l := range rep.Lost {
		gotLost[l.EventID] = l
	}
	t.Logf("after the failover: %d events read, %d lost (want %d), history accepted %v, %d journals to rebuild, %d aggregates to move, %d not rebuildable",
		rep.Read, len(rep.Lost), len(wantLost), rep.History.Accepted, len(rep.Plan.Rebuild), len(rep.Plan.Moves), len(rep.Plan.Record))
	if len(gotLost) != len(wantLost) || rep.History.Accepted || rep.Clean() {
		t.Fatalf("check: %d lost events, want the %d of the lost postings; history accepted %v (want not: the standby was promoted)",
			len(gotLost), len(wantLost), rep.History.Accepted)
	}
	for id, w := range wantLost {
		l := gotLost[id]
		if l.JournalID != w.journal || l.AggregateID != w.account || l.Revision != w.revision || l.Delta != w.delta ||
			l.Currency != "EUR" || !l.Rebuild || len(l.SeenBy) != 3 {
			t.Fatalf("lost event %s: got %+v, want %+v, rebuildable, seen by 3 sources", id, l, w)
		}
	}
	if len(rep.Plan.Rebuild) != len(lostPostings) || len(rep.Plan.Record) != 0 {
		t.Fatalf("plan: rebuild %d journals (want %d), record %d (want none)", len(rep.Plan.Rebuild), len(lostPostings), len(rep.Plan.Record))
	}

	// The dry run writes nothing.
	st := readLedgerState(t, pool)
	if dry, err := ops.FailoverRecover(ctx, cfg, true); err != nil || dry.Recovery != nil || len(dry.Lost) != len(wantLost) {
		t.Fatalf("dry run: %v, recovery %+v, %d lost", err, dry.Recovery, len(dry.Lost))
	}
	if after := readLedgerState(t, pool); after != st {
		t.Fatalf("the dry run wrote: %+v, then %+v", st, after)
	}

	if recover {
		rec, err := ops.FailoverRecover(ctx, cfg, false)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Recovery == nil || len(rec.Recovery.Rebuilt) != len(lostPostings) || !rec.Recovery.HistoryAccepted || rec.Recovery.SequencesMoved != 2 {
			t.Fatalf("recovery: %+v", rec.Recovery)
		}
		for _, p := range lostPostings {
			got, err := nr.store.Posting(ctx, p.JournalID)
			if err != nil {
				t.Fatalf("GET posting %s after the recovery: %v", p.JournalID, err)
			}
			for i, e := range p.Events {
				if i >= len(got.Entries) || got.Entries[i].EventID != e.EventID || got.Entries[i].Revision != e.Revision || got.Entries[i].Account != e.Account {
					t.Fatalf("posting %s: entries %+v, want the events %+v", p.JournalID, got.Entries, p.Events)
				}
			}
		}
		if h, err := opsstore.NewFailoverStore(pool).History(ctx); err != nil || !h.Accepted {
			t.Fatalf("history after the recovery: %+v, %v", h, err)
		}
		wait.For(t, 5*time.Second, "the relay's and the API's check to accept the recovered history", func() bool {
			return watch.Check(ctx) == nil
		})
		if relaytest.Unrelayed(t, pool) != 0 {
			t.Fatalf("%d outbox rows unrelayed after the recovery: the re-committed events would go out as new", relaytest.Unrelayed(t, pool))
		}
		nr.assertBalancesMatch(t)
		again, err := ops.FailoverRecover(ctx, cfg, false)
		if err != nil || again.Recovery != nil || !again.Clean() {
			t.Fatalf("second recovery: %v, recovery %+v, clean %v", err, again.Recovery, again.Clean())
		}
	}

	// Life goes on on the new primary.
	afterFrom := len(nr.posted)
	newEvents := nr.post(t, 8)
	nr.relay(t, nil)
	total := int64(before + events + newEvents)
	wait.For(t, opsWait, "every event has a disposition in both consumers", func() bool {
		for _, c := range []string{projection.Name, auditlog.Name} {
			var n int64
			for _, v := range counts(t, consumer, c).Events {
				n += v
			}
			if n != total {
				return false
			}
		}
		return true
	})
	var newMinOutbox, newMinSeq int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT min(o.id) FROM outbox o WHERE o.journal_id = ANY($1::text[]::uuid[])),
    (SELECT min(sequence) FROM journals WHERE id = ANY($1::text[]::uuid[]))`, journalIDs(nr.posted[afterFrom:])).
		Scan(&newMinOutbox, &newMinSeq); err != nil {
		t.Fatal(err)
	}
	lostRevs := map[string]int64{}
	for _, w := range wantLost {
		lostRevs[w.account] = max(lostRevs[w.account], w.revision)
	}
	reused := 0
	for _, p := range nr.posted[afterFrom:] {
		for _, e := range p.Events {
			if e.Revision <= lostRevs[e.Account] {
				reused++
			}
		}
	}
	// Each record names the timeline its row was written on: the old
	// primary's for the lost events, the promoted standby's for the new.
	newIDs := map[string]bool{}
	for _, p := range nr.posted[afterFrom:] {
		for _, e := range p.Events {
			newIDs[e.EventID] = true
		}
	}
	timelines := map[string]map[int32]int{"lost": {}, "new": {}}
	for _, e := range relaytest.Delivered(t, f.Sink) {
		switch {
		case newIDs[e.EventID]:
			timelines["new"][e.LedgerTimeline]++
		case wantLost[e.EventID] != (want{}):
			timelines["lost"][e.LedgerTimeline]++
		}
	}
	if timelines["lost"][1] != len(wantLost) || timelines["new"][2] != len(newIDs) {
		t.Fatalf("ledger_timeline headers: %v, want the %d lost events on timeline 1 and the %d new ones on 2", timelines, len(wantLost), len(newIDs))
	}
	proj, audit := counts(t, consumer, projection.Name), counts(t, consumer, auditlog.Name)
	t.Logf("recover %v: new postings: %d events reuse a lost event's revision; first new outbox id %d (old primary's last %d), first new journal sequence %d (old last %d); "+
		"projection %d revision_conflict, %d duplicate; audit log %d revision_conflict",
		recover, reused, newMinOutbox, oldOutboxID, newMinSeq, oldJournalSeq, proj.Events[core.DispositionRevisionConflict],
		proj.Events[core.DispositionDuplicate], audit.Events[core.DispositionRevisionConflict])

	if !recover {
		// The control: the loss the recovery prevents.
		if reused == 0 || proj.Events[core.DispositionRevisionConflict] == 0 || audit.Events[core.DispositionRevisionConflict] == 0 ||
			newMinOutbox > oldOutboxID {
			t.Fatalf("control: without the recovery nothing was reissued (%d revisions reused, conflicts %d/%d, outbox id %d <= %d)",
				reused, proj.Events[core.DispositionRevisionConflict], audit.Events[core.DispositionRevisionConflict],
				newMinOutbox, oldOutboxID)
		}
		late, err := ops.FailoverCheck(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(late.Lost) != len(wantLost) || len(late.Plan.Rebuild) == len(lostPostings) || len(late.Plan.Record) == 0 {
			t.Fatalf("check after reissue: %d lost, %d rebuildable journals, %d to record: want the reissued ones named as not rebuildable",
				len(late.Lost), len(late.Plan.Rebuild), len(late.Plan.Record))
		}
		return
	}
	if reused != 0 || proj.Events[core.DispositionRevisionConflict] != 0 || audit.Events[core.DispositionRevisionConflict] != 0 ||
		newMinOutbox <= oldOutboxID || newMinSeq <= oldJournalSeq {
		t.Fatalf("after the recovery: %d revisions reused, conflicts %d/%d, first outbox id %d (want > %d), first sequence %d (want > %d)",
			reused, proj.Events[core.DispositionRevisionConflict], audit.Events[core.DispositionRevisionConflict],
			newMinOutbox, oldOutboxID, newMinSeq, oldJournalSeq)
	}
	nr.waitApplied(t, int(total))
	nr.assertBalancesMatch(t)
	rc := nr.reconcile(t, nil)
	if !rc.Clean {
		t.Errorf("reconcile after the recovery is not clean: ledger %+v, consumers %+v", rc.Ledger, rc.Consumers)
	}
	if fin, err := ops.FailoverCheck(ctx, cfg); err != nil || !fin.Clean() {
		t.Fatalf("check at the end: %v, clean %v, %d lost", err, fin.Clean(), len(fin.Lost))
	}
}

func journalIDs(ps []core.PostingResult) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.JournalID
	}
	return out
}

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
	t.Run("the standby replayed the last pass", func(t *testing.T) { t.Parallel(); failoverFromMarks(t, true) })
	t.Run("the standby stopped between the passes", func(t *testing.T) { t.Parallel(); failoverFromMarks(t, false) })
}

func failoverFromMarks(t *testing.T, witnessed bool) {
	ctx := context.Background()
	f := relaytest.NewFailover(t, pgcluster.Options{})
	consumer := consumerOnItsOwnServer(t)
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

// consumerOnItsOwnServer is a consumer database, migrated as `posthorn
// migrate --consumer` leaves it, on a throwaway server of its own: a
// reconcile mark is the oldest transaction running on the whole server,
// and other tests' transactions on the shared one would hold it back at
// will.
func consumerOnItsOwnServer(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	c := pgtest.Cluster(t, pgcluster.Options{})
	admin, err := postgres.Connect(ctx, c.URL("postgres"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE DATABASE consumer"); err != nil {
		t.Fatal(err)
	}
	url := c.URL("consumer")
	if err := postgres.Migrate(ctx, url, postgres.ConsumerSchema); err != nil {
		t.Fatal(err)
	}
	for _, tables := range pgtest.ExampleTables() {
		if _, err := postgres.UpgradeTables(ctx, url, tables); err != nil {
			t.Fatal(err)
		}
	}
	return pgtest.SmallPool(t, url, 8)
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
