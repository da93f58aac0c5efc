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

	"github.com/posthorn/posthorn/internal/testkit/wait"
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

// A standby streams from its primary through its slot; a row committed
// while it is shut down is missing once the primary is killed and the
// standby promoted: the failover the relay's standby_flush guards against.
func TestStandbyMissesWhatWasCommittedWhileItWasDown(t *testing.T) {
	t.Parallel()
	p := start(t, Options{ExtraConf: map[string]string{"synchronous_commit": "on"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := p.StartStandby(ctx, "standby_a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	pc, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	if _, err := pc.Exec(ctx, `CREATE TABLE t (v text); INSERT INTO t VALUES ('seen')`); err != nil {
		t.Fatal(err)
	}
	var name string
	wait.For(t, 30*time.Second, "the standby to catch up", func() bool {
		var flushed bool
		err := pc.QueryRow(ctx, `SELECT application_name, coalesce(flush_lsn >= pg_current_wal_insert_lsn(), false) FROM pg_stat_replication`).Scan(&name, &flushed)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return flushed
	})
	if name != "standby_a" {
		t.Errorf("pg_stat_replication application_name %q, want standby_a", name)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Exec(ctx, `INSERT INTO t VALUES ('lost')`); err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	sc, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(ctx)
	var got string
	if err := sc.QueryRow(ctx, `SELECT string_agg(v, ',' ORDER BY v) FROM t`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "seen" {
		t.Fatalf("promoted standby holds %q, want only the row it had received (seen)", got)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("Stop after Kill: %v", err)
	}
}
