package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// CheckSchema tells a database without the schema, one behind the binary
// and one up to date apart; Upgrade names what it applied, and nothing on
// a second run.
func TestCheckSchemaAndUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn, 2)
	st, err := postgres.CheckSchema(ctx, pool, postgres.LedgerSchema)
	if err != nil || !st.Missing || st.Current() {
		t.Fatalf("empty database: %+v, %v", st, err)
	}
	if err := postgres.MigrateTo(ctx, dsn, postgres.LedgerSchema, 6); err != nil {
		t.Fatal(err)
	}
	st, err = postgres.CheckSchema(ctx, pool, postgres.LedgerSchema)
	if err != nil || st.Missing || len(st.Pending) == 0 || !strings.HasPrefix(st.Pending[0], "00007_") {
		t.Fatalf("schema at version 6: %+v, %v", st, err)
	}
	applied, err := postgres.Upgrade(ctx, dsn, postgres.LedgerSchema)
	if err != nil || len(applied) != len(st.Pending) || applied[0] != st.Pending[0] {
		t.Fatalf("upgrade applied %v, %v; pending were %v", applied, err, st.Pending)
	}
	if st, err = postgres.CheckSchema(ctx, pool, postgres.LedgerSchema); err != nil || !st.Current() {
		t.Fatalf("after the upgrade: %+v, %v", st, err)
	}
	if applied, err = postgres.Upgrade(ctx, dsn, postgres.LedgerSchema); err != nil || len(applied) != 0 {
		t.Fatalf("second upgrade applied %v, %v", applied, err)
	}
	// The consumer schema has its own version table: still missing here.
	if st, err = postgres.CheckSchema(ctx, pool, postgres.ConsumerSchema); err != nil || !st.Missing {
		t.Fatalf("consumer schema in a ledger-only database: %+v, %v", st, err)
	}
}

// The consumer schema is Posthorn's own tables alone; a consumer's tables
// migrate from its own files under a version table named after its role,
// and a set without a consumer's name or files is refused before the
// database is touched.
func TestConsumerTablesBesideTheConsumerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if err := postgres.Migrate(ctx, dsn, postgres.ConsumerSchema); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, dsn, 2)
	tables := postgres.Tables{Consumer: projection.Name, FS: projection.Tables}
	if got := pgtest.Column[bool](t, pool, `SELECT to_regclass('projection_balances') IS NULL`); !got[0] {
		t.Fatal("the consumer schema created projection_balances")
	}
	if st, err := postgres.CheckTables(ctx, pool, tables); err != nil || !st.Missing {
		t.Fatalf("before: %+v, %v", st, err)
	}
	applied, err := postgres.UpgradeTables(ctx, dsn, tables)
	if err != nil || len(applied) == 0 || applied[0] != "00001_projection_balances.sql" {
		t.Fatalf("upgrade applied %v, %v", applied, err)
	}
	if got := pgtest.Column[string](t, pool, `SELECT to_regclass('posthorn_consumer_balance_projection_migrations')::text`); got[0] == "" {
		t.Fatal("no version table named after the consumer's role")
	}
	if st, err := postgres.CheckTables(ctx, pool, tables); err != nil || !st.Current() {
		t.Fatalf("after: %+v, %v", st, err)
	}
	for _, bad := range []postgres.Tables{{FS: projection.Tables}, {Consumer: projection.Name}} {
		if _, err := postgres.UpgradeTables(ctx, dsn, bad); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

// Ledger migration 00019 moves the balances into the journal lines and
// back: a ledger whose balances an earlier release kept in account_balances
// shows the same balances after it, its next postings' lines carry them on
// from there, a rollback to 00018 writes each balance back into the table,
// and a second upgrade carries on from those.
func TestBalanceLinesMigrateBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.LedgerAt(t, 18)
	pool := pgtest.Pool(t, dsn, 4)
	// One posting as release 00018 wrote it: lines without balances.
	if _, err := pool.Exec(ctx, `INSERT INTO accounts (id) VALUES ('acc-a'), ('acc-b');
INSERT INTO account_balances (account_id, currency, balance) VALUES ('acc-a', 'EUR', -500), ('acc-b', 'EUR', 500);
INSERT INTO journals (id, sequence, posted_at) VALUES ('00000000-0000-7000-8000-000000000001', nextval('journal_sequence'), now());
INSERT INTO journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision) VALUES
    ('00000000-0000-7000-8000-000000000001', 1, 'acc-a', 'debit', 500, 'EUR', 1),
    ('00000000-0000-7000-8000-000000000001', 2, 'acc-b', 'credit', 500, 'EUR', 1)`); err != nil {
		t.Fatal(err)
	}
	balances := func(want string) {
		t.Helper()
		got := strings.Join(pgtest.Column[string](t, pool, `SELECT account_id || ' ' || currency || ' ' || balance FROM account_balances ORDER BY 1`), ", ")
		if got != want {
			t.Fatalf("balances %q, want %q", got, want)
		}
	}
	post := func(key string, amount int64) {
		t.Helper()
		store := ledgerstore.New(pool, ledgerstore.Config{})
		if _, _, err := store.Post(ctx, key, core.Posting{Entries: []core.Entry{
			{Account: "acc-a", Direction: core.Debit, Amount: amount, Currency: "EUR"},
			{Account: "acc-b", Direction: core.Credit, Amount: amount, Currency: "EUR"},
			{Account: "acc-b", Direction: core.Debit, Amount: 1, Currency: "USD"},
			{Account: "acc-a", Direction: core.Credit, Amount: 1, Currency: "USD"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := postgres.Migrate(ctx, dsn, postgres.LedgerSchema); err != nil {
		t.Fatal(err)
	}
	balances("acc-a EUR -500, acc-b EUR 500")
	post("k-1", 100)
	balances("acc-a EUR -600, acc-a USD 1, acc-b EUR 600, acc-b USD -1")
	if err := postgres.MigrateDownTo(ctx, dsn, postgres.LedgerSchema, 18); err != nil {
		t.Fatal(err)
	}
	balances("acc-a EUR -600, acc-a USD 1, acc-b EUR 600, acc-b USD -1")
	if err := postgres.Migrate(ctx, dsn, postgres.LedgerSchema); err != nil {
		t.Fatal(err)
	}
	post("k-2", 10)
	balances("acc-a EUR -610, acc-a USD 2, acc-b EUR 610, acc-b USD -2")
}
