package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/pgtest"
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
