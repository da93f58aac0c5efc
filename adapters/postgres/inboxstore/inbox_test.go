package inboxstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

// inboxEvent is revision rev of account acc with a fixed event ID.
func inboxEvent(acc string, rev int64) core.Envelope {
	return core.Envelope{
		EventID: fmt.Sprintf("%s-r%d", acc, rev), Kind: core.KindEvent, Type: core.TypeAccountPosted,
		AggregateType: core.AggregateAccount, AggregateID: acc, Revision: rev,
		OccurredAt: time.Now().UTC(), Payload: []byte(`{}`),
	}
}

// newInbox is the inbox of a fresh consumer database and the effects
// table of its handler.
func newInbox(t *testing.T) (*inboxstore.Inbox, consumers.Handler, func() []string) {
	t.Helper()
	_, pool := pgtest.Consumer(t)
	apply, read := effects(t, pool)
	return inboxstore.New(pool), apply, read
}

// effects records applied events in a table of the consumer database, in
// the handler's transaction, so a rolled back apply leaves no trace.
func effects(t *testing.T, pool *pgxpool.Pool) (consumers.Handler, func() []string) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (n bigserial, event_id text)`); err != nil {
		t.Fatal(err)
	}
	apply := func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, e.EventID)
		return err
	}
	read := func() []string { return pgtest.Column[string](t, pool, `SELECT event_id FROM effects ORDER BY n`) }
	return apply, read
}

func mustReceive(t *testing.T, in *inboxstore.Inbox, consumer string, ordered bool, e core.Envelope, apply consumers.Handler, want core.Disposition) consumers.Outcome {
	t.Helper()
	out, err := in.Receive(context.Background(), consumer, ordered, e, apply)
	if err != nil {
		t.Fatalf("receive %s: %v", e.EventID, err)
	}
	if out.Disposition != want {
		t.Fatalf("receive %s: disposition %s (%s), want %s", e.EventID, out.Disposition, out.Reason, want)
	}
	return out
}

func TestInboxRepeatIsAbsorbedAndCounted(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	e := inboxEvent("acc-a", 1)
	mustReceive(t, in, "c", false, e, apply, core.DispositionApplied)
	for range 2 {
		out := mustReceive(t, in, "c", false, e, apply, core.DispositionDuplicate)
		if !out.Repeat {
			t.Fatal("a repeat of a known event ID is not flagged as one")
		}
	}
	if got := read(); len(got) != 1 {
		t.Fatalf("effects %v, want exactly one", got)
	}
	recs, err := in.Dispositions(context.Background(), "c", []string{e.EventID, "unknown"})
	if err != nil {
		t.Fatal(err)
	}
	if r := recs[e.EventID]; r.Disposition != core.DispositionApplied || r.Duplicates != 2 {
		t.Fatalf("record %+v, want applied with 2 duplicates", r)
	}
	if _, ok := recs["unknown"]; ok {
		t.Fatal("an unseen event ID has a disposition")
	}
	c, err := in.Count(context.Background(), "c")
	if err != nil {
		t.Fatal(err)
	}
	if c.DuplicatesAbsorbed != 2 || c.Events[core.DispositionApplied] != 1 {
		t.Fatalf("counts %+v", c)
	}
	// Another consumer is independent: it applies the same event.
	mustReceive(t, in, "other", false, e, apply, core.DispositionApplied)
}

// Two instances receiving the same event at once: the primary key makes
// one wait for the other, so the effect happens once. The apply of the
// first is held open until both have started, so they truly overlap.
func TestInboxConcurrentInstancesApplyOnce(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			t.Parallel()
			in, apply, read := newInbox(t)
			e := inboxEvent("acc-race", 1)
			entered := make(chan struct{}, 2)
			release := make(chan struct{})
			slow := func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
				entered <- struct{}{}
				<-release
				return apply(ctx, tx, e)
			}
			var wg sync.WaitGroup
			outs := make([]consumers.Outcome, 2)
			errs := make([]error, 2)
			for i := range 2 {
				wg.Go(func() { outs[i], errs[i] = in.Receive(context.Background(), "c", ordered, e, slow) })
			}
			<-entered // one is inside its handler, holding the inbox row
			// Give the other time to block on the row (it cannot enter the
			// handler: if it did, entered would receive a second time).
			select {
			case <-entered:
				t.Fatal("both instances entered the handler for one event")
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := read(); len(got) != 1 {
				t.Fatalf("effects %v, want one", got)
			}
			ds := []core.Disposition{outs[0].Disposition, outs[1].Disposition}
			if !(ds[0] == core.DispositionApplied && ds[1] == core.DispositionDuplicate) &&
				!(ds[1] == core.DispositionApplied && ds[0] == core.DispositionDuplicate) {
				t.Fatalf("dispositions %v, want one applied and one duplicate", ds)
			}
		})
	}
}

func TestInboxGapHeldThenDrainedInOrder(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	ctx := context.Background()
	mustReceive(t, in, "p", true, inboxEvent("acc", 3), apply, core.DispositionHeld)
	mustReceive(t, in, "p", true, inboxEvent("acc", 2), apply, core.DispositionHeld)
	if got := read(); len(got) != 0 {
		t.Fatalf("applied %v ahead of revision 1", got)
	}
	if out := mustReceive(t, in, "p", true, inboxEvent("acc", 1), apply, core.DispositionApplied); !out.HeldSuccessors {
		t.Fatalf("revision 1 applied with revisions 2 and 3 held, but no held successors reported: %+v", out)
	}
	outs, err := in.Drain(ctx, "p", true, core.AggregateAccount, "acc", apply)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 2 {
		t.Fatalf("drained %+v, want revisions 2 and 3", outs)
	}
	want := []string{"acc-r1", "acc-r2", "acc-r3"}
	if got := read(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
	// Nothing held behind revision 4: its caller has nothing to drain.
	if out := mustReceive(t, in, "p", true, inboxEvent("acc", 4), apply, core.DispositionApplied); out.HeldSuccessors {
		t.Fatalf("revision 4 reports held successors with none held: %+v", out)
	}
	// A lower revision under a new event ID is a conflict, not an effect.
	other := inboxEvent("acc", 2)
	other.EventID = "acc-r2-under-another-id"
	if out := mustReceive(t, in, "p", true, other, apply, core.DispositionRevisionConflict); out.ConflictsWith != "acc-r2" {
		t.Fatalf("conflict %+v, want it to name acc-r2", out)
	}
	if last, _ := in.LastRevision(ctx, "p", core.AggregateAccount, "acc"); last != 4 {
		t.Fatalf("last revision %d, want 4", last)
	}
	if got := read(); len(got) != 4 {
		t.Fatalf("effects %v, want the conflict not applied", got)
	}
}

// Negative control for the gap check: the same out-of-order delivery to an
// unordered consumer applies revision 3 first.
func TestInboxUnorderedAppliesOutOfOrder(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	mustReceive(t, in, "a", false, inboxEvent("acc", 3), apply, core.DispositionApplied)
	mustReceive(t, in, "a", false, inboxEvent("acc", 1), apply, core.DispositionApplied)
	if got := read(); fmt.Sprint(got) != "[acc-r3 acc-r1]" {
		t.Fatalf("effects %v", got)
	}
}

func TestInboxParkAfterHoldAndRelease(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	ctx := context.Background()
	mustReceive(t, in, "p", true, inboxEvent("acc", 1), apply, core.DispositionApplied)
	mustReceive(t, in, "p", true, inboxEvent("acc", 3), apply, core.DispositionHeld)

	// Inside the hold time nothing parks.
	if parked, err := in.ParkExpiredHolds(ctx, "p", time.Hour); err != nil || len(parked) != 0 {
		t.Fatalf("parked %v, %v inside the hold time", parked, err)
	}
	parked, err := in.ParkExpiredHolds(ctx, "p", 0)
	if err != nil || len(parked) != 1 || parked[0].Events != 1 {
		t.Fatalf("parked %+v, %v; want acc with one event", parked, err)
	}
	t.Logf("park reason: %s", parked[0].Reason)
	// Later events wait behind the park; so does the missing one when it
	// finally arrives (a replay): nothing is applied while parked.
	mustReceive(t, in, "p", true, inboxEvent("acc", 4), apply, core.DispositionParkedGap)
	mustReceive(t, in, "p", true, inboxEvent("acc", 2), apply, core.DispositionParkedGap)
	if got := read(); fmt.Sprint(got) != "[acc-r1]" {
		t.Fatalf("effects %v while parked", got)
	}
	list, err := in.Parked(ctx, "p")
	if err != nil || len(list) != 1 || list[0].Events != 3 {
		t.Fatalf("parked list %+v, %v", list, err)
	}
	recs, _ := in.Dispositions(ctx, "p", []string{"acc-r3"})
	if recs["acc-r3"].Disposition != core.DispositionParkedGap {
		t.Fatalf("acc-r3 is %+v", recs["acc-r3"])
	}

	n, err := in.Release(ctx, "p", core.AggregateAccount, "acc")
	if err != nil || n != 3 {
		t.Fatalf("released %d, %v; want 3", n, err)
	}
	refs, err := in.Runnable(ctx, "p", true)
	if err != nil || len(refs) != 1 {
		t.Fatalf("runnable %v, %v", refs, err)
	}
	if _, err := in.Drain(ctx, "p", true, core.AggregateAccount, "acc", apply); err != nil {
		t.Fatal(err)
	}
	if got := read(); fmt.Sprint(got) != "[acc-r1 acc-r2 acc-r3 acc-r4]" {
		t.Fatalf("effects %v after release, want revisions 1..4 in order", got)
	}
	c, _ := in.Count(ctx, "p")
	if c.ParkedAggregates != 0 || c.Events[core.DispositionApplied] != 4 {
		t.Fatalf("counts %+v", c)
	}
}

func TestInboxPoisonParksAggregateOnly(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	ctx := context.Background()
	boom := errors.New("cannot apply")
	failing := func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		if e.EventID == "bad-r1" {
			return boom
		}
		return apply(ctx, tx, e)
	}
	_, err := in.Receive(ctx, "p", true, inboxEvent("bad", 1), failing)
	var ae *consumers.ApplyError
	if !errors.As(err, &ae) || !errors.Is(err, boom) {
		t.Fatalf("err %v, want ApplyError wrapping the handler's", err)
	}
	out, err := in.ParkPoison(ctx, "p", true, ae.Envelope, err.Error())
	if err != nil || out.Disposition != core.DispositionParkedPoison {
		t.Fatalf("park poison: %+v, %v", out, err)
	}
	mustReceive(t, in, "p", true, inboxEvent("bad", 2), failing, core.DispositionParkedGap)
	mustReceive(t, in, "p", true, inboxEvent("good", 1), failing, core.DispositionApplied)
	if got := read(); fmt.Sprint(got) != "[good-r1]" {
		t.Fatalf("effects %v", got)
	}
	// Fixed handler, release: both events of "bad" apply in order.
	if _, err := in.Release(ctx, "p", core.AggregateAccount, "bad"); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Drain(ctx, "p", true, core.AggregateAccount, "bad", apply); err != nil {
		t.Fatal(err)
	}
	if got := read(); fmt.Sprint(got) != "[good-r1 bad-r1 bad-r2]" {
		t.Fatalf("effects %v", got)
	}
}

func TestInboxReject(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Consumer(t)
	in := inboxstore.New(pool)
	ctx := context.Background()
	e := inboxEvent("acc", 1)
	out, err := in.Reject(ctx, "c", e.EventID, e, map[string]string{"kind": "command"}, []byte("x"), "wrong kind")
	if err != nil || out.Disposition != core.DispositionRejected {
		t.Fatalf("%+v, %v", out, err)
	}
	out, err = in.Reject(ctx, "c", e.EventID, e, nil, nil, "wrong kind")
	if err != nil || !out.Repeat {
		t.Fatalf("%+v, %v", out, err)
	}
	list, err := in.List(ctx, "c", core.DispositionRejected, 10)
	if err != nil || len(list) != 1 || list[0].Reason != "wrong kind" || list[0].Duplicates != 1 {
		t.Fatalf("%+v, %v", list, err)
	}
}

// A long list is read as a range first (Recorded): the answer must be the
// same whatever the IDs' spread. Asked: consecutive IDs (the range has them
// all), then IDs spread over many more rows of the consumer than the range
// may read; some of them are not in the inbox, one is not even of the IDs'
// form, one is asked twice, and another consumer's rows share the IDs.
func TestInboxRecordedOfALongListWhateverTheSpread(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	in := inboxstore.New(pool)
	if _, err := pool.Exec(ctx, `
INSERT INTO consumer_inbox (consumer, event_id, disposition, reason, duplicates)
SELECT c, lpad(g::text, 6, '0'), CASE WHEN g % 3 = 0 THEN 'parked_gap' ELSE 'applied' END,
       CASE WHEN g % 3 = 0 THEN 'gap ' || g END, CASE WHEN c = 'c' THEN g % 5 ELSE 0 END
FROM generate_series(0, 9999) g, unnest(ARRAY['c', 'other']) c
WHERE g % 7 <> 0`); err != nil {
		t.Fatal(err)
	}
	for _, step := range []int{1, 50} {
		ids := []string{"not-received", "001002"}
		for g := 1000; len(ids) <= 200; g += step {
			ids = append(ids, fmt.Sprintf("%06d", g))
		}
		recs, err := in.Recorded(ctx, "c", ids)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != len(ids) {
			t.Fatalf("step %d: %d answers for %d IDs", step, len(recs), len(ids))
		}
		for i, id := range ids {
			var g int
			_, scanErr := fmt.Sscanf(id, "%d", &g)
			r := recs[i]
			if scanErr != nil || g%7 == 0 || g > 9999 {
				if r != (ops.Disposition{}) {
					t.Fatalf("step %d, %s: a disposition %+v for an ID the consumer never recorded", step, id, r)
				}
				continue
			}
			want, reason := string(core.DispositionApplied), ""
			if g%3 == 0 {
				want, reason = string(core.DispositionParkedGap), fmt.Sprintf("gap %d", g)
			}
			if r.Disposition != want || r.Reason != reason || r.Duplicates != int64(g%5) {
				t.Fatalf("step %d, %s: %+v, want %s (%q) with %d duplicates", step, id, r, want, reason, g%5)
			}
		}
	}
}

// AppliedTwice names the revisions applied under more than one event ID,
// and only those: not a revision applied once and absorbed as a duplicate
// under another ID, not the same revision of another aggregate (or of an
// aggregate whose type and ID run together the same way), not revision 0.
// Without a revision applied twice it answers nothing, from its count of
// hashes alone.
func TestInboxAppliedTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	in := inboxstore.New(pool)
	add := func(consumer, id, aggType, aggID string, rev int64, d core.Disposition) {
		t.Helper()
		if _, err := pool.Exec(ctx, `
INSERT INTO consumer_inbox (consumer, event_id, aggregate_type, aggregate_id, revision, disposition)
VALUES ($1, $2, $3, $4, $5, $6)`, consumer, id, aggType, aggID, rev, string(d)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []string{"c", "other"} {
		add(c, "e1", "account", "acc-1", 1, core.DispositionApplied)
		add(c, "e2", "account", "acc-1", 2, core.DispositionApplied)
		add(c, "e3", "account", "acc-1", 2, core.DispositionDuplicate)
		add(c, "e4", "account", "acc-2", 2, core.DispositionApplied)
		add(c, "e5", "accoun", "tacc-2", 2, core.DispositionApplied)
		add(c, "e6", "account", "acc-3", 0, core.DispositionApplied)
		add(c, "e7", "account", "acc-3", 0, core.DispositionApplied)
	}
	groups, err := in.AppliedTwice(ctx, "c")
	if err != nil || len(groups) != 0 {
		t.Fatalf("groups %v, %v; want none", groups, err)
	}
	add("c", "e8", "account", "acc-1", 2, core.DispositionApplied)
	add("c", "e9", "account", "acc-2", 2, core.DispositionApplied)
	add("c", "e10", "account", "acc-2", 2, core.DispositionApplied)
	groups, err = in.AppliedTwice(ctx, "c")
	slices.SortFunc(groups, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	if err != nil || !reflect.DeepEqual(groups, [][]string{{"e10", "e4", "e9"}, {"e2", "e8"}}) {
		t.Fatalf("groups %v, %v; want [[e10 e4 e9] [e2 e8]]", groups, err)
	}
	if groups, err := in.AppliedTwice(ctx, "other"); err != nil || len(groups) != 0 {
		t.Fatalf("another consumer's groups %v, %v; want none", groups, err)
	}
}
