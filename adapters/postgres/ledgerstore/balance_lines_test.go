package ledgerstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// balanceRead is the statement a posting reads its balances with, under
// its accounts' locks.
const balanceRead = `SELECT b.account_id, b.currency, b.balance
FROM unnest($1::text[], $2::text[]) AS u(a, c) JOIN account_balances AS b ON b.account_id = u.a AND b.currency = u.c`

// While a REPEATABLE READ snapshot pins the horizon, the balance of an
// account with thousands of postings behind it is read with as many pages
// as one with a single posting, and no posting writes a new version of
// the account's row or of its balance's: the balance is the newest journal
// line's. Control: the migrations up to 00018, whose posting added its
// delta to the balance's row (the same statement, run as often): the hot
// balance's update walks every version the snapshot keeps.
func TestPostingCostStaysFlatUnderASnapshot(t *testing.T) {
	t.Parallel()
	const postings = 3000
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	store := ledgerstore.New(pool, ledgerstore.Config{})
	post := func(key, from, to string) {
		t.Helper()
		if _, _, err := store.Post(ctx, key, transfer(from, to, 7, "EUR")); err != nil {
			t.Fatal(err)
		}
	}
	post("cold", "acc-c1", "acc-c2")
	post("hot-0", "acc-h1", "acc-h2")
	versions := func() []string {
		return pgtest.Column[string](t, pool, `SELECT 'account ' || id || ' ' || xmin::text FROM accounts
UNION ALL SELECT 'balance ' || account_id || ' ' || xmin::text FROM account_opening_balances ORDER BY 1`)
	}
	before := versions()
	holdSnapshot(t, pool)
	for i := range postings {
		post(fmt.Sprintf("hot-%d", i+1), "acc-h1", "acc-h2")
	}
	if after := versions(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("rows rewritten by postings: before %v, after %v", before, after)
	}
	if got := pgtest.Column[int64](t, pool, `SELECT balance FROM account_balances WHERE account_id = 'acc-h2'`); got[0] != 7*(postings+1) {
		t.Fatalf("acc-h2's balance is %d, want %d", got[0], 7*(postings+1))
	}
	read := func(account string) int {
		return explainBuffers(t, pool, balanceRead, []string{account}, []string{"EUR"})
	}
	read("acc-c1") // the EXPLAIN's own plans
	cold, hot := read("acc-c1"), read("acc-h1")

	oldURL := pgtest.LedgerAt(t, 18)
	old := pgtest.SmallPool(t, oldURL, 2)
	const upsert = `INSERT INTO account_balances AS b (account_id, currency, balance)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
ON CONFLICT (account_id, currency) DO UPDATE SET balance = b.balance + EXCLUDED.balance`
	if _, err := old.Exec(ctx, `INSERT INTO accounts (id) VALUES ('acc-c1'), ('acc-h1')`); err != nil {
		t.Fatal(err)
	}
	holdSnapshot(t, old)
	for i := range postings + 1 {
		if i == 0 {
			if _, err := old.Exec(ctx, upsert, []string{"acc-c1"}, []string{"EUR"}, []int64{-7}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := old.Exec(ctx, upsert, []string{"acc-h1"}, []string{"EUR"}, []int64{-7}); err != nil {
			t.Fatal(err)
		}
	}
	oldRead := func(account string) int {
		return explainBuffers(t, old, upsert, []string{account}, []string{"EUR"}, []int64{-7})
	}
	oldRead("acc-c1")
	oldCold, oldHot := oldRead("acc-c1"), oldRead("acc-h1")
	t.Logf("buffers of a posting's balances under a snapshot, an account with 1 posting / with %d: %d / %d (control, the row updated: %d / %d)",
		postings+1, cold, hot, oldCold, oldHot)
	if hot > cold+2 {
		t.Errorf("the balance of an account with %d postings read %d buffers, one with 1 read %d", postings+1, hot, cold)
	}
	if oldHot < 2*oldCold {
		t.Errorf("control: with the row updated, %d buffers for the account with %d postings, %d for the one with 1: the snapshot did not bite",
			oldHot, postings+1, oldCold)
	}
}

// explainBuffers runs query under EXPLAIN (ANALYZE, BUFFERS), which
// commits what it writes, and returns the shared buffers it touched.
func explainBuffers(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var plan string
	if err := pool.QueryRow(context.Background(), `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+query, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	return sharedBuffers(t, plan)
}
