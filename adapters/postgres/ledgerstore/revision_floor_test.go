package ledgerstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
)

// publishRevision publishes one event of wallet id in its own transaction
// and returns its revision.
func publishRevision(t testing.TB, pool *pgxpool.Pool, id string) int64 {
	t.Helper()
	var rev int64
	if err := pool.QueryRow(context.Background(), `SELECT revision FROM posthorn_publish('wallet', $1, 'wallet.credited', '{"amount":"1"}')`,
		id).Scan(&rev); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	return rev
}

// A publish locks its aggregate's row without raising it, so the newest
// revision lives in the outbox; cleanup deletes relayed outbox rows, and
// the delete trigger keeps what they held as the row's floor: the next
// revision after every row of the aggregate is gone is still the next one.
// Control: with the trigger off, the count starts again below what was
// already sent.
func TestRevisionsGoOnAfterTheOutboxRowsAreDeleted(t *testing.T) {
	t.Parallel()
	url, owner := roletest.Ledger(t)
	pub := roletest.As(t, url, postgres.RolePublisher)
	maint := roletest.As(t, url, postgres.RoleMaintainer)
	ctx := context.Background()

	for want := int64(1); want <= 3; want++ {
		if got := publishRevision(t, pub, "w-1"); got != want {
			t.Fatalf("revision %d, want %d", got, want)
		}
	}
	if floor := pgtest.Column[int64](t, owner, `SELECT revision FROM posthorn_aggregates WHERE aggregate_id = 'w-1'`); floor[0] != 1 {
		t.Fatalf("floor %d after three publishes, want 1: the publish wrote its row again", floor[0])
	}
	// As cleanup does it: the maintainer deletes relayed rows.
	if _, err := maint.Exec(ctx, `DELETE FROM outbox WHERE aggregate_id = 'w-1' AND revision >= 2`); err != nil {
		t.Fatal(err)
	}
	if got := publishRevision(t, pub, "w-1"); got != 4 {
		t.Fatalf("revision %d after the newest rows were deleted, want 4", got)
	}
	if _, err := maint.Exec(ctx, `DELETE FROM outbox WHERE aggregate_id = 'w-1'`); err != nil {
		t.Fatal(err)
	}
	if got := publishRevision(t, pub, "w-1"); got != 5 {
		t.Fatalf("revision %d after every row of the aggregate was deleted, want 5", got)
	}

	// Control: the same deletes without the trigger.
	for range 3 {
		publishRevision(t, pub, "w-2")
	}
	if _, err := owner.Exec(ctx, `ALTER TABLE outbox DISABLE TRIGGER outbox_revision_floor`); err != nil {
		t.Fatal(err)
	}
	if _, err := maint.Exec(ctx, `DELETE FROM outbox WHERE aggregate_id = 'w-2'`); err != nil {
		t.Fatal(err)
	}
	if got := publishRevision(t, pub, "w-2"); got != 2 {
		t.Fatalf("control: revision %d without the trigger, want 2 (the floor of a new aggregate, 1, plus one)", got)
	}
}

// A caller at REPEATABLE READ does not see a revision committed after its
// snapshot; its publish of that aggregate fails as a serialization failure
// (40001), which such callers retry, and the retry gets the next revision.
func TestPublishAtRepeatableReadMeetsAConcurrentRevision(t *testing.T) {
	t.Parallel()
	url, _ := roletest.Ledger(t)
	pub := roletest.As(t, url, postgres.RolePublisher)
	ctx := context.Background()
	publishRevision(t, pub, "w-rr")

	tx, err := pub.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot
		t.Fatal(err)
	}
	if got := publishRevision(t, pub, "w-rr"); got != 2 {
		t.Fatalf("concurrent revision %d, want 2", got)
	}
	_, err = tx.Exec(ctx, `SELECT posthorn_publish('wallet', 'w-rr', 'wallet.credited', '{"amount":"1"}')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("publish behind a concurrent revision at REPEATABLE READ: %v, want SQLSTATE 40001", err)
	}
	_ = tx.Rollback(ctx)
	if got := publishRevision(t, pub, "w-rr"); got != 3 {
		t.Fatalf("retried revision %d, want 3", got)
	}
}

// While a REPEATABLE READ snapshot pins the horizon, a publish of an
// aggregate with thousands of events behind it reads as many pages as one
// of an aggregate with three: it writes no new version of the aggregate's
// row. Both are measured at the end, on the same tables, so what grows
// with the tables alone (their indexes' depth) counts for both. Control:
// the migrations up to 00017, whose publish bumped the row: the hot
// aggregate's publish walks the dead versions the snapshot keeps.
func TestPublishCostStaysFlatUnderASnapshot(t *testing.T) {
	t.Parallel()
	const events = 3000
	oldURL := pgtest.LedgerAt(t, 17)
	newURL, _ := pgtest.Ledger(t)
	cold, hot := publishBuffersUnderASnapshot(t, newURL, events)
	oldCold, oldHot := publishBuffersUnderASnapshot(t, oldURL, events)
	t.Logf("buffers of one publish under a snapshot, an aggregate with 3 events / with %d: %d / %d (control, the row bumped: %d / %d)",
		events, cold, hot, oldCold, oldHot)
	if hot > cold+2 {
		t.Errorf("a publish of an aggregate with %d events read %d buffers, one with 3 read %d", events, hot, cold)
	}
	// The control's extra reads, five times the slack allowed above (its
	// cold publish reads 17–19 buffers from run to run, so a ratio to it
	// is no steady measure).
	if oldHot-oldCold < 10 {
		t.Errorf("control: with the row bumped, %d buffers for the aggregate with %d events, %d for the one with 3: the snapshot did not bite", oldHot, events, oldCold)
	}
}

// holdSnapshot opens a REPEATABLE READ transaction on pool and takes its
// snapshot, which pins the database's horizon until the transaction is
// rolled back (at the latest when tb ends): a report's, pg_dump's.
func holdSnapshot(tb testing.TB, pool *pgxpool.Pool) pgx.Tx {
	tb.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM accounts`); err != nil {
		tb.Fatal(err)
	}
	return tx
}

// publishBuffersUnderASnapshot holds a REPEATABLE READ snapshot on url,
// publishes 3 events of one aggregate and events of another, and then
// returns the shared buffers one more publish of each touches.
func publishBuffersUnderASnapshot(t *testing.T, url string, events int) (cold, hot int) {
	t.Helper()
	pool := pgtest.SmallPool(t, url, 2)
	holdSnapshot(t, pool)
	for range 3 {
		publishRevision(t, pool, "w-cold")
	}
	for range events {
		publishRevision(t, pool, "w-hot")
	}
	buffers := func(id string) int {
		return explainBuffers(t, pool, `SELECT * FROM posthorn_publish('wallet', $1, 'wallet.credited', '{"amount":"1"}')`, id)
	}
	buffers("w-cold") // the EXPLAIN's own plans
	return buffers("w-cold"), buffers("w-hot")
}

// sharedBuffers reads the top node's shared hits and reads from an
// EXPLAIN (FORMAT JSON); a function's statements count in its caller's
// node.
func sharedBuffers(t *testing.T, plan string) int {
	t.Helper()
	var p []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		}
	}
	if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p) != 1 {
		t.Fatalf("plan %s: %v", plan, err)
	}
	return p[0].Plan.Hit + p[0].Plan.Read
}

// failover_advance moves an aggregate only past its newest revision, the
// greater of the floor and the outbox's (a service's aggregate) or the
// journal lines' (an account): one that already holds the revision named
// is not counted as moved, and one moved goes on from there.
func TestFailoverAdvanceCountsOnlyTrueMoves(t *testing.T) {
	t.Parallel()
	url, owner := roletest.Ledger(t)
	pub := roletest.As(t, url, postgres.RolePublisher)
	store := ledgerstore.New(roletest.As(t, url, postgres.RoleAPI), ledgerstore.Config{})
	ctx := context.Background()
	for range 5 {
		publishRevision(t, pub, "w-f")
	}
	post := func(key string) int64 {
		t.Helper()
		res, _, err := store.Post(ctx, key, transfer("acc-f", "acc-g", 1, "EUR"))
		if err != nil {
			t.Fatal(err)
		}
		return res.Events[0].Revision
	}
	for i := range 5 {
		post("k-" + strconv.Itoa(i))
	}
	advance := func(typ, id string, rev int64) int {
		t.Helper()
		var moved int
		if err := owner.QueryRow(ctx, `SELECT aggregates_moved FROM posthorn.failover_advance(0, 0, ARRAY[$1], ARRAY[$2], ARRAY[$3::bigint])`,
			typ, id, rev).Scan(&moved); err != nil {
			t.Fatal(err)
		}
		return moved
	}
	for _, a := range []struct{ typ, id string }{{"wallet", "w-f"}, {"account", "acc-f"}} {
		if n := advance(a.typ, a.id, 3); n != 0 {
			t.Fatalf("advancing %s %s at revision 5 to 3 moved %d, want 0", a.typ, a.id, n)
		}
		if n := advance(a.typ, a.id, 7); n != 1 {
			t.Fatalf("advancing %s %s at revision 5 to 7 moved %d, want 1", a.typ, a.id, n)
		}
		if n := advance(a.typ, a.id, 7); n != 0 {
			t.Fatalf("advancing %s %s to 7 again moved %d, want 0", a.typ, a.id, n)
		}
	}
	if got := publishRevision(t, pub, "w-f"); got != 8 {
		t.Fatalf("wallet revision %d after the advance to 7, want 8", got)
	}
	if got := post("k-next"); got != 8 {
		t.Fatalf("account revision %d after the advance to 7, want 8", got)
	}
}
