package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

var binPath string

// TestMain builds the binary once: the CLI is tested as users run it. No
// test may leave a goroutine behind.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "posthorn-bin")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "posthorn")
	if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	goleak.VerifyTestMain(m,
		// sarama (under watermill-kafka, the consume test's publisher)
		// starts go-metrics' meter ticker once per process, for good.
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		goleak.Cleanup(func(code int) {
			os.RemoveAll(dir)
			os.Exit(code)
		}))
}

// cliCommand is the binary with args, env added to the environment.
func cliCommand(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// startCLI starts cmd and kills it at the end of the test if it still runs.
func startCLI(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// runCLI runs the binary to its exit and returns the exit code, stdout and
// stderr.
func runCLI(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := cliCommand(env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

func TestUnknownCommandExits2(t *testing.T) {
	code, _, stderr := runCLI(t, nil, "frobnicate")
	if code != 2 || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
}

func TestConfigPrintRedactsSecrets(t *testing.T) {
	const secret = "hunter2-hunter2-hunter2"
	code, stdout, stderr := runCLI(t, []string{
		"POSTHORN_DATABASE__URL=postgres://ledger:" + secret + "@127.0.0.1:5432/ledger",
		"POSTHORN_API__TOKENS=" + secret,
	}, "config", "print")
	if code != 0 {
		t.Fatalf("code %d: %s", code, stderr)
	}
	if strings.Contains(stdout+stderr, secret) {
		t.Fatalf("secret printed:\n%s", stdout)
	}
	if !strings.Contains(stdout, "postgres://ledger:REDACTED@127.0.0.1:5432/ledger") {
		t.Fatalf("database.url missing from output:\n%s", stdout)
	}
}

func TestBadConfigStopsWithTheKey(t *testing.T) {
	code, _, stderr := runCLI(t, []string{"POSTHORN_RELAY__MODE=push"}, "config", "print")
	if code != 1 || !strings.Contains(stderr, "relay.mode") {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, []string{"POSTHORN_DATABASE__URL="}, "migrate")
	if code != 1 || !strings.Contains(stderr, "database.url") {
		t.Fatalf("migrate without database.url: code %d, stderr %q", code, stderr)
	}
}

// migrate writes the configuration the SQL functions obey into the
// database, refuses a reserved command topic prefix naming its key, and
// warns about a schema public every role may create in (PostgreSQL 14's
// default) but not about 15's.
func TestMigrateWritesSettingsAndWarnsAboutWritablePublic(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	env := []string{"POSTHORN_DATABASE__URL=" + url, "POSTHORN_SINK__COMMAND_TOPIC_PREFIX=cmd.", "POSTHORN_RETENTION__IDEMPOTENCY_KEY_TTL=48h"}
	code, _, stderr := runCLI(t, env, "migrate")
	if code != 0 || strings.Contains(stderr, "SCHEMA public IS WRITABLE") {
		t.Fatalf("migrate: code %d: %s", code, stderr)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var prefix, ttl string
	if err := conn.QueryRow(context.Background(), `SELECT command_topic_prefix, idempotency_key_ttl::text FROM posthorn.settings`).Scan(&prefix, &ttl); err != nil || prefix != "cmd." || ttl != "48:00:00" {
		t.Fatalf("settings %q %q %v", prefix, ttl, err)
	}
	if code, _, stderr := runCLI(t, append(env, "POSTHORN_SINK__COMMAND_TOPIC_PREFIX=ledger."), "migrate"); code != 1 || !strings.Contains(stderr, "sink.command_topic_prefix") || !strings.Contains(stderr, "reserved") {
		t.Fatalf("migrate with a reserved prefix: code %d: %s", code, stderr)
	}
	if _, err := conn.Exec(context.Background(), `GRANT CREATE ON SCHEMA public TO PUBLIC`); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, env, "migrate"); code != 0 || !strings.Contains(stderr, "SCHEMA public IS WRITABLE") || !strings.Contains(stderr, "PUBLIC") {
		t.Fatalf("migrate with public writable: code %d, no warning: %s", code, stderr)
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	for i := 0; i < 2; i++ {
		code, _, stderr := runCLI(t, nil, "migrate", "--database.url", url)
		if code != 0 {
			t.Fatalf("run %d: code %d: %s", i, code, stderr)
		}
		code, _, stderr = runCLI(t, []string{"POSTHORN_CONSUMER__DATABASE__URL=" + url}, "migrate", "--consumer")
		if code != 0 {
			t.Fatalf("run %d --consumer: code %d: %s", i, code, stderr)
		}
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n); err != nil {
		t.Fatalf("ledger schema missing: %v", err)
	}
}
