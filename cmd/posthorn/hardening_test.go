package main

import (
	"context"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// A caller who can write an aggregate ID cannot drive the operator's
// terminal through `outbox status`: the ID is printed quoted, escapes
// visible, in text mode.
func TestOutboxStatusQuotesControlCharacters(t *testing.T) {
	t.Parallel()
	url, pool := pgtest.Ledger(t)
	const forged = "acc-\x1b[2J\x1b[1;1Hbackup: 0 unrelayed\r\n"
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_parked (aggregate_type, aggregate_id, event_id, reason)
		VALUES ('account', $1, gen_random_uuid(), $2)`, forged, "refused\x07 for good"); err != nil {
		t.Fatal(err)
	}
	// Negative control: the escape sequences are in the database as
	// written, so an unquoted print would send them to the terminal.
	var stored string
	if err := pool.QueryRow(ctx, `SELECT aggregate_id FROM relay_parked`).Scan(&stored); err != nil || stored != forged {
		t.Fatalf("stored %q, %v", stored, err)
	}
	code, stdout, stderr := runCLI(t, []string{"POSTHORN_DATABASE__URL=" + url}, "outbox", "status")
	if code != 0 {
		t.Fatalf("code %d: %s", code, stderr)
	}
	if strings.ContainsAny(stdout, "\x1b\x07\r") {
		t.Fatalf("control characters printed raw:\n%q", stdout)
	}
	for _, want := range []string{`"acc-\x1b[2J\x1b[1;1Hbackup: 0 unrelayed\r\n"`, `"refused\a for good"`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %s:\n%s", want, stdout)
		}
	}
	if got := printable("acc-bob"); got != "acc-bob" {
		t.Errorf("a plain ID is quoted: %s", got)
	}
}

// A tracing.endpoint query parameter (a collector's API key) is printed
// neither by config print nor in the "tracing on" log line.
func TestTracingEndpointQueryRedacted(t *testing.T) {
	t.Parallel()
	const secret = "k3y-0f-the-c0llector"
	env := []string{"POSTHORN_TRACING__EXPORTER=otlp", "POSTHORN_TRACING__ENDPOINT=http://127.0.0.1:1/otlp?api_key=" + secret + "&tenant=eu"}
	// Negative control: the configuration holds the key as given.
	cfg, err := configs.Load("", env, nil)
	if err != nil || !strings.Contains(cfg.Tracing.Endpoint, secret) {
		t.Fatalf("endpoint %q, %v", cfg.Tracing.Endpoint, err)
	}
	code, stdout, stderr := runCLI(t, env, "config", "print")
	if code != 0 {
		t.Fatalf("code %d: %s", code, stderr)
	}
	if strings.Contains(stdout+stderr, secret) {
		t.Fatalf("the collector's key is printed:\n%s\n%s", stdout, stderr)
	}
	if !strings.Contains(stdout, "http://127.0.0.1:1/otlp?api_key=REDACTED&tenant=REDACTED") || !strings.Contains(stderr, "api_key=REDACTED") {
		t.Fatalf("endpoint missing from the output:\n%s\n%s", stdout, stderr)
	}
}

// An insecure TLS option warns at start, naming its key; without it there
// is no such warning.
func TestInsecureTLSWarnsAtStart(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLI(t, []string{"POSTHORN_SINK__KIND=nats", "POSTHORN_SINK__NATS__TLS__INSECURE_SKIP_VERIFY=true"}, "config", "print")
	if code != 0 || !strings.Contains(stderr, "config key sink.nats.tls.insecure_skip_verify is true") {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, []string{"POSTHORN_SINK__KIND=nats"}, "config", "print")
	if code != 0 || strings.Contains(stderr, "insecure") {
		t.Fatalf("without the option: code %d, stderr %q", code, stderr)
	}
}

// The demo refuses configured databases that already hold postings,
// before it writes anything; on empty ones it runs.
func TestDemoRefusesALiveLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo")
	}
	t.Parallel()
	url, pool := pgtest.Ledger(t)
	ctx := context.Background()
	if _, _, err := ledgerstore.New(pool, ledgerstore.Config{}).Post(ctx, "live-1", core.Posting{Entries: []core.Entry{
		{Account: "acc-alice", Direction: core.Debit, Amount: 10, Currency: "EUR"},
		{Account: "acc-bob", Direction: core.Credit, Amount: 10, Currency: "EUR"},
	}}); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM journals) + (SELECT count(*) FROM outbox)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	env := []string{"POSTHORN_DATABASE__URL=" + url, "POSTHORN_CONSUMER__DATABASE__URL=" + url}
	code, stdout, stderr := runCLI(t, env, "demo", "--postings", "20", "--sink", "memory")
	if code != 1 || !strings.Contains(stderr, "config key database.url: its database already holds journals rows") {
		t.Fatalf("code %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	if strings.Contains(stderr, "throwaway database") {
		t.Errorf("claims a throwaway database it never made: %s", stderr)
	}
	if after := count(); after != before {
		t.Fatalf("the demo wrote into the live ledger: %d rows, were %d", after, before)
	}
	// Negative control: empty configured databases are taken.
	empty := []string{"POSTHORN_DATABASE__URL=" + pgtest.NewDatabase(t), "POSTHORN_CONSUMER__DATABASE__URL=" + pgtest.NewDatabase(t)}
	if code, _, stderr := runCLI(t, empty, "demo", "--postings", "20", "--sink", "memory", "--json"); code != 0 {
		t.Fatalf("demo on empty databases: code %d: %s", code, stderr)
	}
}
