package main

import (
	"context"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/pgtest"
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
