package main

import (
	"context"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// Every command that works on the ledger or the consumer database stops at
// start on a database without this binary's schema, naming the migrate
// command to run, instead of answering 500s or logging "relation does not
// exist" for ever.
func TestCommandsNameTheMigrationOnAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ledger := "POSTHORN_DATABASE__URL=" + url
	consumer := "POSTHORN_CONSUMER__DATABASE__URL=" + url
	cases := []struct {
		args []string
		env  []string
		code int
		want string
	}{
		{[]string{"api", "--api.listen", "127.0.0.1:0"}, []string{ledger}, 1, "run `posthorn migrate` first"},
		{[]string{"relay", "--sink.kind", "memory"}, []string{ledger}, 1, "run `posthorn migrate` first"},
		{[]string{"outbox", "status"}, []string{ledger}, 1, "run `posthorn migrate` first"},
		{[]string{"outbox", "release", "--account", "a"}, []string{ledger}, 1, "run `posthorn migrate` first"},
		{[]string{"reconcile"}, []string{ledger, consumer}, 2, "run `posthorn migrate` first"},
		{[]string{"archive", "--archive.dir", t.TempDir()}, []string{ledger}, 1, "run `posthorn migrate` first"},
		{[]string{"consume", "--sink.kind", "memory"}, []string{consumer}, 1, "run `posthorn migrate --consumer` first"},
		{[]string{"consume", "status"}, []string{consumer}, 1, "run `posthorn migrate --consumer` first"},
		{[]string{"retention", "--only", "idempotency-keys"}, []string{ledger}, 1, "run `posthorn migrate` first"},
		{[]string{"retention", "--only", "inbox"}, []string{consumer}, 1, "run `posthorn migrate --consumer` first"},
	}
	for _, c := range cases {
		code, _, stderr := runCLI(t, c.env, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "does not exist") {
			t.Errorf("%v: code %d, stderr %q; want code %d and %q", c.args, code, stderr, c.code, c.want)
		}
	}

	// migrate says what it applied, and on a second run that there was
	// nothing to apply.
	code, stdout, stderr := runCLI(t, []string{ledger}, "migrate")
	if code != 0 || !strings.Contains(stdout, "ledger schema: applied ") || !strings.Contains(stdout, "00001_ledger.sql") || strings.Contains(stdout, "up to date") {
		t.Fatalf("first migrate: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, []string{ledger}, "migrate")
	if code != 0 || !strings.Contains(stdout, "ledger schema is up to date: no migration to apply") {
		t.Fatalf("second migrate: code %d, stdout %q", code, stdout)
	}

	// Negative control: on the migrated ledger the same command runs.
	if code, _, stderr := runCLI(t, []string{ledger}, "outbox", "status"); code != 0 {
		t.Fatalf("outbox status on a migrated ledger: code %d, %s", code, stderr)
	}

	// A schema older than the binary names the migration it lacks.
	pool := pgtest.Pool(t, url, 1)
	var last string
	err := pool.QueryRow(context.Background(), `DELETE FROM posthorn_ledger_migrations
		WHERE version_id = (SELECT max(version_id) FROM posthorn_ledger_migrations) RETURNING lpad(version_id::text, 5, '0')`).Scan(&last)
	if err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI(t, []string{ledger}, "outbox", "status")
	if code != 1 || !strings.Contains(stderr, "1 migration(s) pending ("+last+"_") || !strings.Contains(stderr, "run `posthorn migrate` first") {
		t.Fatalf("a schema one migration behind: code %d, stderr %q", code, stderr)
	}
}

// The example consumers' tables migrate from files beside those consumers,
// with version tables of their own. A consumer database an older release
// migrated has the schema and the tables (its first migration created
// them) but not those version tables: the consumer commands name the
// migration to run, and `migrate --consumer` records the tables without
// touching their rows.
func TestConsumerCommandsNameTheExampleTablesTheyLack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	consumer := "POSTHORN_CONSUMER__DATABASE__URL=" + url
	if err := postgres.Migrate(ctx, url, postgres.ConsumerSchema); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, url, 1)
	// What the older release's first consumer migration left, with a row.
	if _, err := pool.Exec(ctx, `CREATE TABLE projection_balances (account text NOT NULL, currency text NOT NULL,
		balance numeric(38, 0) NOT NULL DEFAULT 0, revision bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (account, currency));
		INSERT INTO projection_balances (account, currency, balance, revision) VALUES ('acc-kept', 'EUR', 4200, 7)`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"consume", "status"}, {"consume", "--sink.kind", "memory"}} {
		code, _, stderr := runCLI(t, []string{consumer}, args...)
		if code != 1 || !strings.Contains(stderr, "the tables of the example consumer audit-log are missing or older than this posthorn") ||
			!strings.Contains(stderr, "run `posthorn migrate --consumer` first") {
			t.Errorf("%v without the example tables' migrations: code %d, stderr %q", args, code, stderr)
		}
	}
	code, stdout, stderr := runCLI(t, []string{consumer}, "migrate", "--consumer")
	for _, want := range []string{"consumer schema is up to date: no migration to apply",
		"the tables of audit-log: applied 2 migration(s): 00001_audit_log.sql, 00002_audit_log_idempotency_digest.sql",
		"the tables of balance-projection: applied 2 migration(s): 00001_projection_balances.sql, 00002_hot_room.sql"} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("migrate --consumer: code %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
		}
	}
	if got := pgtest.Column[string](t, pool, `SELECT account || ' ' || balance || ' ' || revision FROM projection_balances`); len(got) != 1 || got[0] != "acc-kept 4200 7" {
		t.Fatalf("the older release's balances after the migration: %q", got)
	}
	if code, _, stderr := runCLI(t, []string{consumer}, "consume", "status"); code != 0 {
		t.Fatalf("consume status after migrate --consumer: code %d, %s", code, stderr)
	}
	code, stdout, _ = runCLI(t, []string{consumer}, "migrate", "--consumer")
	if code != 0 || !strings.Contains(stdout, "the tables of balance-projection are up to date: no migration to apply") {
		t.Fatalf("second migrate --consumer: code %d, stdout %q", code, stdout)
	}
}
