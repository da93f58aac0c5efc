package inboxstore_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// markInbox is a fresh consumer database and its inbox.
func markInbox(t *testing.T) (context.Context, *pgxpool.Pool, *inboxstore.Inbox) {
	t.Helper()
	_, pool := pgtest.Consumer(t)
	return context.Background(), pool, inboxstore.New(pool)
}

// addRow writes an inbox row as a consumer's transaction would.
func addRow(t *testing.T, pool *pgxpool.Pool, consumer, id string, rev int64, disposition string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
INSERT INTO consumer_inbox (consumer, event_id, aggregate_type, aggregate_id, revision, disposition)
VALUES ($1, $2, 'account', 'acc-1', $3, $4)`, consumer, id, rev, disposition); err != nil {
		t.Fatal(err)
	}
}

// idsSince reads every event ID EventIDsSince hands over, checking the
// pages' size.
func idsSince(t *testing.T, in *inboxstore.Inbox, consumer string, since uint64, batch int) []string {
	t.Helper()
	var all []string
	err := in.InboxEventIDsSince(context.Background(), consumer, since, batch, func(ids []string) error {
		if len(ids) == 0 || len(ids) > batch {
			return fmt.Errorf("a page of %d IDs, want 1 to %d", len(ids), batch)
		}
		all = append(all, ids...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	return all
}

// A pass's mark is usable by the next pass only on the same server and
// ledger history; from it, the next pass reads the rows inserted or
// updated since, page by page, each once, and no other consumer's.
func TestInboxMarkReadsWhatChangedSince(t *testing.T) {
	t.Parallel()
	ctx, pool, in := markInbox(t)
	const history = "system 1 timeline 1"

	p, err := in.BeginPass(ctx, "c", history)
	if err != nil || p.Next == 0 || p.Since != 0 || !strings.Contains(p.Why, "no clean pass") {
		t.Fatalf("first pass %+v, %v; want a mark to record and none to read from", p, err)
	}
	for i := range 25 {
		addRow(t, pool, "c", fmt.Sprintf("old-%02d", i), int64(i+1), "applied")
	}
	p, err = in.BeginPass(ctx, "c", history)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.RecordMark(ctx, "c", p.Next, history, ""); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 12 {
		addRow(t, pool, "c", fmt.Sprintf("new-%02d", i), int64(100+i), "applied")
		want = append(want, fmt.Sprintf("new-%02d", i))
		addRow(t, pool, "other", fmt.Sprintf("other-%02d", i), int64(100+i), "applied")
	}
	// A change to an old row (its repeats counted) makes it a change too.
	if _, err := pool.Exec(ctx, `UPDATE consumer_inbox SET duplicates = duplicates + 1 WHERE consumer = 'c' AND event_id = 'old-07'`); err != nil {
		t.Fatal(err)
	}
	want = append(want, "old-07")
	slices.Sort(want)

	next, err := in.BeginPass(ctx, "c", history)
	if err != nil || next.Since != p.Next || next.Next < p.Next {
		t.Fatalf("next pass %+v, %v; want it from mark %d", next, err, p.Next)
	}
	// The mark is the oldest transaction running anywhere on the server, so
	// another test's may put it below some old rows: those are read again
	// too, which costs time but hides nothing.
	var atOrAfter []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(event_id ORDER BY event_id), '{}') FROM consumer_inbox
WHERE consumer = 'c' AND changed_xid >= $1::text::xid8`, strconv.FormatUint(next.Since, 10)).Scan(&atOrAfter); err != nil {
		t.Fatal(err)
	}
	slices.Sort(atOrAfter)
	for _, batch := range []int{5, 1000} {
		got := idsSince(t, in, "c", next.Since, batch)
		if !reflect.DeepEqual(got, atOrAfter) {
			t.Fatalf("pages of %d: %v, want the rows changed at or after the mark %v", batch, got, atOrAfter)
		}
		for _, id := range want {
			if _, found := slices.BinarySearch(got, id); !found {
				t.Fatalf("pages of %d: %s changed after the mark, not read: %v", batch, id, got)
			}
		}
	}

	if other, err := in.BeginPass(ctx, "c", "system 1 timeline 2"); err != nil || other.Since != 0 || !strings.Contains(other.Why, "another ledger history") {
		t.Fatalf("under another ledger history: %+v, %v; want no mark", other, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE consumer_reconciled SET server = server + 1 WHERE consumer = 'c'`); err != nil {
		t.Fatal(err)
	}
	if moved, err := in.BeginPass(ctx, "c", history); err != nil || moved.Since != 0 || !strings.Contains(moved.Why, "another database server") {
		t.Fatalf("on another server: %+v, %v; want no mark", moved, err)
	}
}

// A transaction still open when the mark is taken commits its row later:
// the mark (the snapshot's oldest running transaction) lies at or below
// it, so the next pass reads the row. Control: a mark taken past the open
// transaction (a transaction ID assigned after it) misses it.
func TestInboxMarkKeepsALateCommit(t *testing.T) {
	t.Parallel()
	ctx, pool, in := markInbox(t)

	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := open.Exec(ctx, `INSERT INTO consumer_inbox (consumer, event_id, disposition) VALUES ('c', 'late', 'applied')`); err != nil {
		t.Fatal(err)
	}
	p, err := in.BeginPass(ctx, "c", "h")
	if err != nil {
		t.Fatal(err)
	}
	past := newestXID(t, pool)
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := idsSince(t, in, "c", p.Next, 10); !slices.Equal(got, []string{"late"}) {
		t.Fatalf("from the pass's mark %d: %v, want [late]", p.Next, got)
	}
	if got := idsSince(t, in, "c", past, 10); len(got) != 0 {
		t.Fatalf("control: from past the open transaction (%d): %v, want nothing: the late row missed", past, got)
	}
}

// newestXID is a transaction ID assigned now: above every row written so
// far, where a pass's mark may lie lower (it is the oldest transaction
// running on the server).
func newestXID(t *testing.T, pool *pgxpool.Pool) uint64 {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_xact_id()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	x, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// A held row turned applied is a change: a revision applied twice by an
// old row and a row applied after a mark is found from the mark.
// Control: without the trigger that stamps updates, the pair is missed.
func TestInboxMarkFindsAHeldRowAppliedLater(t *testing.T) {
	t.Parallel()
	ctx, pool, in := markInbox(t)

	pairFromMark := func(applied, held string) [][]string {
		t.Helper()
		addRow(t, pool, "c", applied, 7, "applied")
		addRow(t, pool, "c", held, 7, "held")
		mark := newestXID(t, pool)
		if _, err := pool.Exec(ctx, `UPDATE consumer_inbox SET disposition = 'applied' WHERE consumer = 'c' AND event_id = $1`, held); err != nil {
			t.Fatal(err)
		}
		groups, err := in.AppliedTwiceSince(ctx, "c", mark)
		if err != nil {
			t.Fatal(err)
		}
		return groups
	}
	if got := pairFromMark("a1", "h1"); !reflect.DeepEqual(got, [][]string{{"a1", "h1"}}) {
		t.Fatalf("applied twice since the mark: %v, want [[a1 h1]]", got)
	}
	// Another aggregate for the control, so the first pair stays apart.
	if _, err := pool.Exec(ctx, `UPDATE consumer_inbox SET aggregate_id = 'acc-0' WHERE consumer = 'c'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE consumer_inbox DISABLE TRIGGER consumer_inbox_changed`); err != nil {
		t.Fatal(err)
	}
	if got := pairFromMark("a2", "h2"); len(got) != 0 {
		t.Fatalf("control: without the trigger: %v, want the pair missed", got)
	}
	if groups, err := in.AppliedTwice(ctx, "c"); err != nil || len(groups) != 2 {
		t.Fatalf("the whole inbox: %v, %v; want both pairs", groups, err)
	}
}

// The pages follow the transaction IDs as numbers: across a power of ten
// (9, 10, 99, 100) as within one.
func TestInboxMarkPagesInTransactionOrder(t *testing.T) {
	t.Parallel()
	ctx, pool, in := markInbox(t)
	for _, x := range []string{"8", "9", "10", "11", "99", "100", "1000"} {
		if _, err := pool.Exec(ctx, `INSERT INTO consumer_inbox (consumer, event_id, disposition, changed_xid)
VALUES ('c', 'at-' || $1, 'applied', $1::xid8)`, x); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := in.InboxEventIDsSince(ctx, "c", 9, 1, func(ids []string) error { got = append(got, ids...); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"at-9", "at-10", "at-11", "at-99", "at-100", "at-1000"}; !slices.Equal(got, want) {
		t.Fatalf("pages of one since 9: %v, want %v", got, want)
	}
}
