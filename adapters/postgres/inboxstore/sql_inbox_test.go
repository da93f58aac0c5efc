package inboxstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
)

// sqlReceive calls posthorn_inbox_receive for e in its own transaction, as
// a consumer outside Go would, and commits when it answers apply or
// duplicate; it returns the answer.
func sqlReceive(t *testing.T, pool *pgxpool.Pool, consumer string, ordered bool, e core.Envelope) (string, int64) {
	t.Helper()
	ctx := context.Background()
	h, err := json.Marshal(e.WireHeaders())
	if err != nil {
		t.Fatal(err)
	}
	var d string
	var waits *int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT disposition, waits_for FROM posthorn_inbox_receive($1, $2::text::jsonb, $3)`,
			consumer, string(h), ordered).Scan(&d, &waits)
	})
	if err != nil {
		t.Fatalf("posthorn_inbox_receive %s r%d: %v", e.AggregateID, e.Revision, err)
	}
	if waits == nil {
		return d, 0
	}
	return d, *waits
}

// TestSQLInboxAnswersApplyDuplicateGap: the SQL protocol's answers for an
// ordered consumer, and what it records: applied once, repeats counted,
// a gap names the revision it waits for and records nothing, another event
// ID at an applied revision is a conflict, a parked aggregate is refused;
// unordered, every new event ID of a new revision applies.
func TestSQLInboxAnswersApplyDuplicateGap(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Consumer(t)
	const c = "py-consumer"
	steps := []struct {
		e     core.Envelope
		want  string
		waits int64
	}{
		{inboxEvent("acc-1", 1), "apply", 0},
		{inboxEvent("acc-1", 1), "duplicate", 0}, // the same event again
		{inboxEvent("acc-1", 3), "gap", 2},
		{inboxEvent("acc-1", 2), "apply", 0},
		{inboxEvent("acc-1", 3), "apply", 0},                                 // redelivered after its predecessor
		{withID(inboxEvent("acc-1", 2), "other-id"), "revision_conflict", 0}, // another event at an applied revision
	}
	for i, s := range steps {
		if d, w := sqlReceive(t, pool, c, true, s.e); d != s.want || w != s.waits {
			t.Fatalf("step %d (%s r%d): %s waits_for %d, want %s %d", i, s.e.EventID, s.e.Revision, d, w, s.want, s.waits)
		}
	}
	got := pgtest.Column[string](t, pool, `SELECT event_id || ' ' || disposition || ' ' || duplicates FROM consumer_inbox WHERE consumer = $1 ORDER BY event_id`, c)
	want := []string{"acc-1-r1 applied 1", "acc-1-r2 applied 0", "acc-1-r3 applied 0", "other-id revision_conflict 0"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("inbox rows %q, want %q", got, want)
	}
	if last := pgtest.Column[int64](t, pool, `SELECT last_revision FROM consumer_positions WHERE consumer = $1`, c); len(last) != 1 || last[0] != 3 {
		t.Fatalf("position %v, want 3", last)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE consumer_positions SET parked = true WHERE consumer = $1`, c); err != nil {
		t.Fatal(err)
	}
	if d, w := sqlReceive(t, pool, c, true, inboxEvent("acc-1", 4)); d != "parked" || w != 4 {
		t.Fatalf("parked aggregate: %s %d", d, w)
	}
	for _, rev := range []int64{5, 2, 9} {
		if d, _ := sqlReceive(t, pool, "unordered", false, inboxEvent("acc-u", rev)); d != "apply" {
			t.Fatalf("unordered r%d: %s", rev, d)
		}
	}
	if d, _ := sqlReceive(t, pool, "unordered", false, inboxEvent("acc-u", 2)); d != "duplicate" {
		t.Fatalf("unordered repeat: %s", d)
	}
}

func withID(e core.Envelope, id string) core.Envelope {
	e.EventID = id
	return e
}

// TestSQLInboxRollbackRecordsNothingAndInstancesApplyOnce: a consumer's
// transaction that rolls back after apply leaves no trace (the next
// delivery applies); two instances receiving the same event at once: the
// second waits for the first and answers duplicate.
func TestSQLInboxRollbackRecordsNothingAndInstancesApplyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	e := inboxEvent("acc-2", 1)
	h, _ := json.Marshal(e.WireHeaders())
	receive := func(tx pgx.Tx) string {
		var d string
		if err := tx.QueryRow(ctx, `SELECT disposition FROM posthorn_inbox_receive('c', $1::text::jsonb)`, string(h)).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := receive(tx); d != "apply" {
		t.Fatalf("first delivery: %s", d)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if d := receive(first); d != "apply" {
		t.Fatalf("after a rollback: %s, want apply", d)
	}
	second := make(chan string, 1)
	go func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			second <- err.Error()
			return
		}
		defer tx.Rollback(ctx)
		var d string
		if err := tx.QueryRow(ctx, `SELECT disposition FROM posthorn_inbox_receive('c', $1::text::jsonb)`, string(h)).Scan(&d); err != nil {
			d = err.Error()
		}
		second <- d
		_ = tx.Commit(ctx)
	}()
	select {
	case d := <-second:
		t.Fatalf("the second instance answered %q while the first had not committed", d)
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if d := <-second; d != "duplicate" {
		t.Fatalf("second instance: %s, want duplicate", d)
	}
}

// TestSQLInboxSharesTheGoInbox: the SQL protocol and the Go inbox keep one
// position per consumer and aggregate: what one applied, the other sees,
// and another event at a revision one of them applied is a conflict to
// both, recorded in the same words.
func TestSQLInboxSharesTheGoInbox(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Consumer(t)
	apply, _ := effects(t, pool)
	goInbox := inboxstore.New(pool)
	mustReceive(t, goInbox, "shared", true, inboxEvent("acc-3", 1), apply, core.DispositionApplied)
	if d, _ := sqlReceive(t, pool, "shared", true, inboxEvent("acc-3", 1)); d != "duplicate" {
		t.Fatalf("SQL after Go applied r1: %s", d)
	}
	if d, _ := sqlReceive(t, pool, "shared", true, inboxEvent("acc-3", 2)); d != "apply" {
		t.Fatalf("SQL r2 after Go's r1: %s", d)
	}
	mustReceive(t, goInbox, "shared", true, inboxEvent("acc-3", 2), apply, core.DispositionDuplicate)
	// A conflict is found across the paths too, naming the event the
	// other path applied: SQL against Go's r1, Go against SQL's r2 (the
	// same reason and park either way).
	if d, _ := sqlReceive(t, pool, "shared", true, withID(inboxEvent("acc-3", 1), "sql-other")); d != "revision_conflict" {
		t.Fatalf("SQL, another event at Go's r1: %s", d)
	}
	if out := mustReceive(t, goInbox, "shared", true, withID(inboxEvent("acc-3", 2), "go-other"), apply, core.DispositionRevisionConflict); out.ConflictsWith != "acc-3-r2" {
		t.Fatalf("Go, another event at SQL's r2: %+v", out)
	}
	got := pgtest.Column[string](t, pool, `SELECT event_id || ' ' || conflicts_with || ': ' || reason FROM consumer_inbox
		WHERE consumer = 'shared' AND disposition = 'revision_conflict' ORDER BY event_id`)
	want := []string{
		"go-other acc-3-r2: revision_conflict: revision 2 applied as event acc-3-r2, received as event go-other",
		"sql-other acc-3-r1: revision_conflict: revision 1 applied as event acc-3-r1, received as event sql-other",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("conflicts %q, want %q", got, want)
	}
	// The first conflict parked the aggregate and stays its reason.
	if p := pgtest.Column[string](t, pool, `SELECT parked_reason FROM consumer_positions WHERE consumer = 'shared'`); len(p) != 1 || p[0] != strings.SplitN(want[1], ": ", 2)[1] {
		t.Fatalf("park %q, want the SQL path's conflict", p)
	}
}

// TestSQLInboxRefusesBadHeadersAndRoles: headers lacking a contract header
// are refused naming it; the consumer role may call the function, the
// relay's may not.
func TestSQLInboxRefusesBadHeadersAndRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := roletest.Consumer(t)
	if _, err := postgres.RegisterConsumers(ctx, url, "c"); err != nil {
		t.Fatal(err)
	}
	roletest.Apply(t, url, postgres.ConsumerSchema)
	consumer := roletest.Pool(t, roletest.Consumers(t, url, "", "c"))
	for _, tc := range []struct{ headers, says string }{
		{`{"kind":"event","type":"t","aggregate_type":"a","aggregate_id":"x","revision":"1"}`, "headers: event_id is missing"},
		{`{"event_id":"e","kind":"event","type":"t","aggregate_type":"a","aggregate_id":"x","revision":"0"}`, "headers: revision is '0'"},
		{`[]`, "headers: want the record's headers"},
	} {
		_, err := consumer.Exec(ctx, `SELECT * FROM posthorn_inbox_receive('c', $1::text::jsonb)`, tc.headers)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.HasPrefix(pgErr.Message, tc.says) {
			t.Errorf("headers %s: %v, want 22023 %q", tc.headers, err, tc.says)
		}
	}
	h, _ := json.Marshal(inboxEvent("acc-4", 1).WireHeaders())
	if _, err := consumer.Exec(ctx, `SELECT * FROM posthorn_inbox_receive('c', $1::text::jsonb)`, string(h)); err != nil {
		t.Fatalf("consumer c's role: %v", err)
	}
	relay := roletest.As(t, url, postgres.RoleRelay)
	if _, err := relay.Exec(ctx, `SELECT * FROM posthorn_inbox_receive('c', $1::text::jsonb)`, string(h)); !roletest.Denied(err) {
		t.Fatalf("posthorn_relay calling posthorn_inbox_receive: %v, want permission denied", err)
	}
}

// TestSQLInboxSkipsADeadLetteredMarker: a consumer outside Go receives the
// skip marker the relay sends for a dead-lettered revision (type
// core.TypeDeadLettered) as skipped, recorded and named, and the next
// revision applies; a repeat of the marker is a duplicate. The control is
// the function before it knew markers (consumer migration 00004): it
// answers apply, and the consumer would hand the marker to its handler as
// if it were the event.
func TestSQLInboxSkipsADeadLetteredMarker(t *testing.T) {
	t.Parallel()
	marker := func(e core.Envelope) core.Envelope {
		e.Type = core.TypeDeadLettered
		return e
	}
	_, pool := pgtest.Consumer(t)
	const c = "py-consumer"
	for i, s := range []struct {
		e    core.Envelope
		want string
	}{
		{inboxEvent("acc-1", 1), "apply"},
		{marker(inboxEvent("acc-1", 2)), "skipped"},
		{marker(inboxEvent("acc-1", 2)), "duplicate"},
		{inboxEvent("acc-1", 3), "apply"},
	} {
		if d, _ := sqlReceive(t, pool, c, true, s.e); d != s.want {
			t.Fatalf("step %d (r%d, %s): %s, want %s", i, s.e.Revision, s.e.Type, d, s.want)
		}
	}
	got := pgtest.Column[string](t, pool, `SELECT event_id || ' ' || disposition || ' ' || coalesce(reason, '') FROM consumer_inbox WHERE consumer = $1 ORDER BY revision`, c)
	if len(got) != 3 || !strings.HasPrefix(got[1], "acc-1-r2 skipped skipped: revision 2 was dead-lettered by an operator") {
		t.Fatalf("inbox rows %q: want revision 2 recorded as skipped, naming the dead-lettering", got)
	}

	// Control: the function of consumer migration 00004.
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if err := postgres.MigrateTo(ctx, dsn, postgres.ConsumerSchema, 4); err != nil {
		t.Fatal(err)
	}
	old := pgtest.Pool(t, dsn, 2)
	sqlReceive(t, old, c, true, inboxEvent("acc-1", 1))
	if d, _ := sqlReceive(t, old, c, true, marker(inboxEvent("acc-1", 2))); d != "apply" {
		t.Fatalf("00004's function answered %s to a marker, want apply: no control", d)
	}
}
