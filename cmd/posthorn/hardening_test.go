package main

import (
	"context"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/pgtest"
	"github.com/posthorn/posthorn/configs"
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
