// Package pgtest gives each test a fresh, migrated database on the Postgres
// server named by POSTHORN_TEST_DATABASE_URL (default: the local server with
// trust auth), dropped when the test ends, and the pools and reads tests
// open on such databases, each closed when its test ends.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// DefaultURL is the server the tests use when POSTHORN_TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ServerURL returns the URL of the test server's maintenance database.
func ServerURL() string {
	if u := os.Getenv("POSTHORN_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// NewDatabase creates an empty database and returns its URL; it is dropped
// (with its connections) at test cleanup.
func NewDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		t.Fatalf("pgtest: connect to the test server: %v (is PostgreSQL running? set POSTHORN_TEST_DATABASE_URL)", err)
	}
	defer admin.Close(ctx)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "posthorn_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), ServerURL())
		if err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(ServerURL())
	if err != nil {
		t.Fatalf("pgtest: POSTHORN_TEST_DATABASE_URL must be a postgres:// URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// Ledger returns the URL and a pool of a fresh database with the ledger schema.
func Ledger(t testing.TB) (string, *pgxpool.Pool) {
	return migrated(t, postgres.LedgerSchema)
}

// LedgerAt returns the URL of a fresh database with the ledger schema up to
// version and no further: a ledger as an older release left it, so a test
// can write rows the way that release did, or run it as a control.
func LedgerAt(t testing.TB, version int64) string {
	t.Helper()
	u := NewDatabase(t)
	if err := postgres.MigrateTo(context.Background(), u, postgres.LedgerSchema, version); err != nil {
		t.Fatalf("pgtest: migrate the ledger to version %d: %v", version, err)
	}
	return u
}

// Consumer returns the URL and a pool of a fresh database with the consumer
// schema and the example consumers' tables, as `posthorn migrate --consumer`
// leaves it.
func Consumer(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	dsn, pool := migrated(t, postgres.ConsumerSchema)
	for _, tables := range ExampleTables() {
		if _, err := postgres.UpgradeTables(context.Background(), dsn, tables); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	return dsn, pool
}

// ExampleTables are the example consumers' own tables, as the posthorn
// binary migrates them.
func ExampleTables() []postgres.Tables {
	return []postgres.Tables{
		{Consumer: projection.Name, FS: projection.Tables},
		{Consumer: auditlog.Name, FS: auditlog.Tables},
	}
}

func migrated(t testing.TB, s postgres.Schema) (string, *pgxpool.Pool) {
	t.Helper()
	dsn := NewDatabase(t)
	ctx := context.Background()
	if err := postgres.Migrate(ctx, dsn, s); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn, Pool(t, dsn, 16)
}

// Pool opens postgres.Connect's pool of at least conns connections on url,
// closed when the test ends.
func Pool(t testing.TB, url string, conns int32) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Connect(context.Background(), url, conns)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// SmallPool opens a pool of at most conns connections on url, closed when
// the test ends, so that many parallel tests on the shared server stay
// under its max_connections. Unlike Pool it does not ping: it connects on
// first use, as pgxpool does.
func SmallPool(t testing.TB, url string, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := postgres.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Column returns the first column of every row query returns on pool, in
// the order returned, failing t on any error.
func Column[T any](t testing.TB, pool *pgxpool.Pool, query string, args ...any) []T {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	vals, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return vals
}

// LedgerState fingerprints the ledger's tables: the row count of each, plus
// the sum of account revisions and of balances, so a test can prove that a
// refused request left no trace. Tables another migration may add are
// not included; pass them as extra.
func LedgerState(t testing.TB, pool *pgxpool.Pool, extra ...string) map[string]string {
	t.Helper()
	tables := append([]string{"accounts", "account_balances", "journals", "journal_lines", "idempotency_keys", "outbox"}, extra...)
	state := make(map[string]string, len(tables)+2)
	ctx := context.Background()
	for _, tbl := range tables {
		var n string
		if err := pool.QueryRow(ctx, "SELECT count(*)::text FROM "+pgx.Identifier{tbl}.Sanitize()).Scan(&n); err != nil {
			t.Fatalf("pgtest: count %s: %v", tbl, err)
		}
		state[tbl] = n
	}
	var revs, bals string
	if err := pool.QueryRow(ctx, "SELECT (SELECT coalesce(sum(revision), 0) FROM account_revisions)::text, (SELECT coalesce(sum(abs(balance::numeric)), 0) FROM account_balances)::text").Scan(&revs, &bals); err != nil {
		t.Fatalf("pgtest: sums: %v", err)
	}
	state["sum(account_revisions.revision)"] = revs
	state["sum(abs(balance))"] = bals
	return state
}

// Listen opens a connection of its own to url listening on channel, as a
// relay waits for its wake-ups; it is closed when tb ends, if not before.
func Listen(tb testing.TB, url, channel string) *pgx.Conn {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("pgtest: listen: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close(ctx) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: listen on %s: %v", channel, err)
	}
	return conn
}

// ShiftBalance moves account's balance (in its newest line's currency) by
// delta behind the ledger's back, as a stray UPDATE would: it changes the
// balance_after of the account's newest journal line, which is the balance
// account_balances shows.
func ShiftBalance(t testing.TB, pool *pgxpool.Pool, account string, delta int64) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE journal_lines SET balance_after = balance_after + $2
WHERE (account_id, revision) = (SELECT account_id, revision FROM journal_lines WHERE account_id = $1 ORDER BY revision DESC LIMIT 1)`,
		account, delta)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("pgtest: shift %s's balance: %d rows, %v", account, tag.RowsAffected(), err)
	}
}

// LogicalCluster starts a throwaway cluster with wal_level=logical (opts
// with Logical set), stopped when the test ends.
func LogicalCluster(t testing.TB, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	opts.Logical = true
	return Cluster(t, opts)
}

// Cluster starts a throwaway cluster with opts, stopped when the test ends.
func Cluster(t testing.TB, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// LogicalLedger starts a throwaway cluster with wal_level=logical (opts with
// Logical set) holding a migrated ledger database, for the CDC tests (the
// shared server runs wal_level=replica). It returns the cluster, the
// ledger's URL and a pool of conns connections; all of it is removed when
// the test ends.
func LogicalLedger(t testing.TB, opts pgcluster.Options, conns int32) (*pgcluster.Cluster, string, *pgxpool.Pool) {
	t.Helper()
	c := LogicalCluster(t, opts)
	pool, url := LedgerIn(t, c, conns)
	return c, url, pool
}

// LedgerIn creates a migrated ledger database of a name of its own in the
// throwaway cluster c and returns a pool of conns connections on it and its
// URL. When the test ends the database is dropped, with the replication
// slots a CDC relay made in it.
func LedgerIn(t testing.TB, c *pgcluster.Cluster, conns int32) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := "ledger_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { dropLedger(c, name) })
	url := c.URL(name)
	if err := postgres.Migrate(ctx, url, postgres.LedgerSchema); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return Pool(t, url, conns), url
}

// dropLedger drops the database name of c and its replication slots,
// ending the WAL senders that stream them first.
func dropLedger(c *pgcluster.Cluster, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return // the cluster is gone, and the database with it
	}
	defer a.Close(ctx)
	_, _ = a.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
	// The ended WAL senders release their slots asynchronously.
	wait.Until(time.Second, func() (bool, string) {
		_, err := a.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		return err == nil, ""
	})
	_, _ = a.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

// Require1M skips a benchmark that loads a million rows (minutes) unless
// POSTHORN_BENCH_1M is set: `make bench` has no time for it. what says
// what the run does, for the skip message.
func Require1M(b testing.TB, what string) {
	b.Helper()
	if os.Getenv("POSTHORN_BENCH_1M") == "" {
		b.Skip("set POSTHORN_BENCH_1M=1: " + what)
	}
}

// EnvInt reads a benchmark's size from the environment variable name,
// def when it is unset; anything but a positive integer fails tb.
func EnvInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// EnvDuration reads a benchmark's duration from the environment variable
// name (Go syntax: 90s, 10m), def when it is unset; anything but a
// positive duration fails tb.
func EnvDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("%s=%q: want a positive duration such as 90s or 10m", name, v)
	}
	return d
}

// PlanWhileNearlyEmpty returns GenericPlan's plan of a statement prepared
// on the ledger of pool while its outbox and queue hold 4 rows (analyzed),
// and explained after they grew to 20,000: the plan the server keeps for a
// statement prepared at a quiet start, or while the relay kept up, and uses
// once the tables are large (or, under a long snapshot, full of deleted
// entries).
func PlanWhileNearlyEmpty(t testing.TB, pool *pgxpool.Pool, prepare, settings, explain string) string {
	t.Helper()
	fill := func(from, to int) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
SELECT gen_random_uuid(), 'event', 't', 't', 'account', 'acc-' || g, 1, g % 16, '', now() FROM generate_series($1::int, $2::int) g`, from, to); err != nil {
			t.Fatal(err)
		}
	}
	fill(1, 4)
	if _, err := pool.Exec(context.Background(), `ANALYZE outbox, outbox_pending, relay_leases`); err != nil {
		t.Fatal(err)
	}
	return GenericPlan(t, pool, prepare, settings, explain, func() { fill(5, 20000) })
}

// GenericPlan prepares query (a PREPARE of a statement named planned) on
// one connection while the tables are as they are, lets grow add rows, and
// returns the cached generic plan of explain (an EXPLAIN of an EXECUTE of
// planned) as compact JSON, under settings.
func GenericPlan(t testing.TB, pool *pgxpool.Pool, prepare, settings, explain string, grow func()) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var plan []byte
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, settings); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, prepare); err != nil {
			return err
		}
		// A generic plan is made at the first EXECUTE, and then kept.
		if _, err := tx.Exec(ctx, explain); err != nil {
			return err
		}
		grow()
		return tx.QueryRow(ctx, explain).Scan(&plan)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `DEALLOCATE planned`); err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(plan, &v); err != nil {
		t.Fatal(err)
	}
	compact, _ := json.Marshal(v)
	return string(compact)
}
