package pgcluster

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start starts a cluster or skips the test when this machine has no
// PostgreSQL server binaries (the only reason to skip).
func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log strings.Builder
	opts.Log = &log
	c, err := Start(ctx, opts)
	if errors.Is(err, ErrNoBinaries) {
		t.Skipf("SKIPPED: %v", err)
	}
	if err != nil {
		t.Fatalf("Start: %v\ninitdb/pg_ctl output:\n%s", err, log.String())
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

func show(t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(context.Background(), "SHOW "+setting).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", setting, err)
	}
	return v
}

func TestLogicalClusterServesAndStopRemovesEverything(t *testing.T) {
	t.Parallel()
	c := start(t, Options{
		Logical:            true,
		MaxSlotWALKeepSize: "64MB",
		// A value with a quote and a space proves settings are not passed
		// through a shell.
		ExtraConf: map[string]string{"application_name": "it's posthorn", "max_replication_slots": "7"},
	})
	ctx := context.Background()

	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("connect %s: %v", c.URL("postgres"), err)
	}
	defer conn.Close(ctx)
	for setting, want := range map[string]string{
		"wal_level":              "logical",
		"max_wal_senders":        "10",
		"max_replication_slots":  "7", // ExtraConf wins over Logical's default
		"max_slot_wal_keep_size": "64MB",
		"application_name":       "it's posthorn",
		"fsync":                  "off",
		"listen_addresses":       "127.0.0.1",
	} {
		if got := show(t, conn, setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	var user string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
		t.Fatal(err)
	}
	if user != c.User() {
		t.Errorf("current_user = %q, want the cluster's superuser %q", user, c.User())
	}
	if os.Geteuid() == 0 && c.User() != "postgres" {
		t.Errorf("as root the cluster must belong to postgres, got %q", c.User())
	}

	// A logical slot can be created: the CDC relay's prerequisite.
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('t', 'pgoutput')"); err != nil {
		t.Fatalf("create logical slot: %v", err)
	}

	if _, err := conn.Exec(ctx, "CREATE DATABASE ledger"); err != nil {
		t.Fatalf("create database: %v", err)
	}
	conn2, err := pgx.Connect(ctx, c.URL("ledger"))
	if err != nil {
		t.Fatalf("connect to the new database: %v", err)
	}
	var db string
	if err := conn2.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "ledger" {
		t.Fatalf("current_database = %q, %v", db, err)
	}
	conn2.Close(ctx)

	dir := c.Dir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("cluster dir before Stop: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster dir %s still there after Stop (stat: %v)", dir, err)
	}
	// The server is gone, not just its files.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if c3, err := pgx.Connect(cctx, c.URL("postgres")); err == nil {
		c3.Close(ctx)
		t.Errorf("server still accepts connections after Stop")
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestPlainClusterHasReplicaWAL(t *testing.T) {
	t.Parallel()
	c := start(t, Options{})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if got := show(t, conn, "wal_level"); got != "replica" {
		t.Errorf("wal_level = %q without Logical, want the default replica", got)
	}
}

func TestNoBinariesNamesThePackage(t *testing.T) {
	// Not parallel: it changes PATH and the Debian root.
	t.Setenv("PATH", t.TempDir())
	old := debianRoot
	debianRoot = t.TempDir()
	defer func() { debianRoot = old }()
	_, err := Start(context.Background(), Options{})
	if !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("Start without binaries: %v, want ErrNoBinaries", err)
	}
	if !strings.Contains(err.Error(), "postgresql") {
		t.Errorf("error %q does not name the package to install", err)
	}
}
