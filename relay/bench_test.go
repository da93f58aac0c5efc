package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

const (
	benchBacklog    = 100_000 // events committed in one transaction for the throughput figure
	benchRate       = 1000    // postings per second (two events each) for the latency figure
	benchLoadPeriod = 10 * time.Second
	benchIdlePeriod = 5 * time.Second
	benchWriterRole = "bench_writer"
)

// dbWork is what the relay cost the database over a period: statements
// run by the relay's role (pg_stat_statements), those naming the outbox,
// and CPU time of the relay's backends (WAL sender included, from /proc).
type dbWork struct {
	stmtsPerSec, outboxStmtsPerSec, rowsPerSec, execMsPerSec, cpuMsPerSec float64
}

// stmtWork is one statement's share of the relay's database work over a
// period (pg_stat_statements).
type stmtWork struct {
	query       string
	calls, rows int64
	execMs      float64
	blocks      int64 // shared buffers hit and read
}

func (w stmtWork) String() string {
	return fmt.Sprintf("%7.1f ms in %5d calls (%7d rows, %8d buffers): %s", w.execMs, w.calls, w.rows, w.blocks, w.query)
}

func (w dbWork) String() string {
	return fmt.Sprintf("%7.1f stmt/s (%6.1f on outbox), %8.0f rows returned/s, exec %6.1f ms/s, backend CPU %6.1f ms/s",
		w.stmtsPerSec, w.outboxStmtsPerSec, w.rowsPerSec, w.execMsPerSec, w.cpuMsPerSec)
}

type modeResult struct {
	drainRate      float64
	drainWall      time.Duration
	drainCPU       float64 // seconds of the relay's backends' CPU over the drain
	drainStmts     []stmtWork
	p50, p99       time.Duration
	idle, loaded   dbWork
	postingsPerSec float64
}

// BenchmarkPollingVsCDC runs the polling relay and the CDC relay side by
// side on the same workload in one throwaway cluster (wal_level=logical,
// pg_stat_statements preloaded), with the in-memory sink so the figures are
// the relay's and the database's, not a broker's:
//
//   - throughput: one transaction commits 100,000 events; time until all
//     are ACKed and marked;
//   - commit-to-ACK p50/p99 at 1,000 two-line postings per second for 10 s
//     (8 writers), from the writer's commit returning to the sink's ACK;
//   - the database's work for the relay idle (5 s) and under that load:
//     statements by the relay's role, those naming the outbox, and CPU time
//     of the relay's backends (the CDC WAL sender's decoding included).
func BenchmarkPollingVsCDC(b *testing.B) {
	c := pgtest.LogicalCluster(b, pgcluster.Options{ExtraConf: map[string]string{
		"shared_preload_libraries": "pg_stat_statements",
		"pg_stat_statements.track": "all",
		"max_connections":          "100",
		// pgcluster turns synchronous_commit off; then a commit reaches the
		// WAL sender only when the WAL writer flushes (wal_writer_delay,
		// 200 ms), which would charge CDC for a setting production does not
		// use.
		"synchronous_commit": "on",
	}})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+benchWriterRole+" LOGIN SUPERUSER"); err != nil {
		b.Fatal(err)
	}
	results := map[string]modeResult{}
	for range b.N {
		for _, mode := range []string{"polling", "cdc"} {
			results[mode] = benchMode(b, c, mode)
		}
	}
	fmt.Printf("\nrelay modes side by side (memory sink, one throwaway PostgreSQL 15 cluster, 2 cores):\n")
	for _, mode := range []string{"polling", "cdc"} {
		r := results[mode]
		fmt.Printf("%-8s throughput: %8.0f events/s draining a %d-event commit\n", mode, r.drainRate, benchBacklog)
		fmt.Printf("%-8s the drain's %s: the relay's backends used %.0f ms of CPU; its statements by execution time:\n",
			mode, r.drainWall.Round(time.Millisecond), r.drainCPU*1000)
		for _, st := range r.drainStmts {
			fmt.Printf("%-8s   %s\n", mode, st)
		}
		fmt.Printf("%-8s commit-to-ACK at %.0f postings/s (%d events/s): p50 %s, p99 %s\n", mode, r.postingsPerSec, 2*int(r.postingsPerSec), r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond))
		fmt.Printf("%-8s database work idle:  %s\n", mode, r.idle)
		fmt.Printf("%-8s database work load:  %s\n", mode, r.loaded)
	}
	b.ReportMetric(results["polling"].drainRate, "polling-events/s")
	b.ReportMetric(results["cdc"].drainRate, "cdc-events/s")
	b.ReportMetric(float64(results["polling"].p99.Microseconds())/1000, "polling-p99-ms")
	b.ReportMetric(float64(results["cdc"].p99.Microseconds())/1000, "cdc-p99-ms")
}

func benchMode(b *testing.B, c *pgcluster.Cluster, mode string) modeResult {
	ctx := context.Background()
	setup, _ := pgtest.LedgerIn(b, c, 16)
	db := setup.Config().ConnConfig.Database
	if _, err := setup.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		b.Fatal(err)
	}
	// Both pools close when this mode ends, not with the benchmark: the
	// next mode's relay CPU is read from every posthorn-relay backend, and
	// each iteration's pools would add up towards max_connections.
	relayPool, err := postgres.Connect(ctx, c.URL(db)+"&application_name="+postgres.RelayApplicationName, 8)
	if err != nil {
		b.Fatal(err)
	}
	defer relayPool.Close()
	writerURL := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", benchWriterRole, c.Port(), db)
	writer, err := postgres.Connect(ctx, writerURL, 16)
	if err != nil {
		b.Fatal(err)
	}
	defer writer.Close()

	sink := relaytest.NewAckTimes(memory.New(memory.Config{}))
	defer sink.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("POSTHORN_BENCH_LOG") != "" {
		quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	stop := relaytest.StartMode(b, mode, relayPool, sink, relay.Settings{Owner: "bench", SinkName: "memory", Logger: quiet,
		CDC: relay.CDC{Slot: "bench_" + strings.TrimPrefix(db, "ledger_")}})
	defer stop()
	var res modeResult

	// Throughput: one commit of benchBacklog events, and where the
	// database's time went while the relay drained it.
	if _, err := writer.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}
	cpu0 := relayCPU(b, writer)
	if err := relaytest.Fill(ctx, writer, "drain", 2000, benchBacklog/2000); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	waitNoneUnrelayed(b, writer, time.Minute)
	res.drainWall = time.Since(start)
	res.drainRate = benchBacklog / res.drainWall.Seconds()
	res.drainCPU = pgtest.CPUSince(cpu0, relayCPU(b, writer))
	res.drainStmts = topStatements(b, writer, db, 4)
	fmt.Fprintf(os.Stderr, "%s: drained %d events in %s\n", mode, benchBacklog, time.Since(start).Round(time.Millisecond))

	// Idle.
	res.idle = measureWork(b, writer, db, benchIdlePeriod, nil)

	// Load: benchRate postings per second for benchLoadPeriod.
	var load *relaytest.Load
	res.loaded = measureWork(b, writer, db, benchLoadPeriod, func() {
		load = relaytest.RunLoad(ctx, writer, benchRate, 8, benchLoadPeriod, "acc", 1000)
	})
	res.postingsPerSec = float64(load.Postings()) / benchLoadPeriod.Seconds()
	waitNoneUnrelayed(b, writer, time.Minute)
	res.p50, res.p99 = relaytest.Percentiles(load.Latencies(b, sink))
	return res
}

func waitNoneUnrelayed(b *testing.B, pool *pgxpool.Pool, d time.Duration) {
	ctx := context.Background()
	// One cheap statement every 20 ms: the relay being measured shares the
	// database.
	drained := wait.UntilEvery(d, 20*time.Millisecond, func() (bool, string) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM outbox_pending LIMIT 1) x`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n == 0, ""
	})
	if !drained {
		var left int
		var slots string
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox_pending`).Scan(&left)
		_ = pool.QueryRow(ctx, `SELECT coalesce(string_agg(format('%s active=%s confirmed=%s current=%s', slot_name, active, confirmed_flush_lsn, pg_current_wal_lsn()), '; '), 'none') FROM pg_replication_slots`).Scan(&slots)
		b.Fatalf("after %s, %d outbox rows are still unrelayed; slots: %s", d, left, slots)
	}
}

// measureWork runs during (or waits period when nil) and returns the
// relay's database work per second over it.
func measureWork(b *testing.B, probe *pgxpool.Pool, db string, period time.Duration, during func()) dbWork {
	ctx := context.Background()
	if _, err := probe.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}
	cpu0 := relayCPU(b, probe)
	start := time.Now()
	if during != nil {
		during()
	} else {
		time.Sleep(period) // the idle period being measured
	}
	secs := time.Since(start).Seconds()
	cpu1 := relayCPU(b, probe)
	var w dbWork
	var calls, outboxCalls, rows float64
	var execMs float64
	err := probe.QueryRow(ctx, `
SELECT coalesce(sum(s.calls), 0)::float8,
       coalesce(sum(s.calls) FILTER (WHERE s.query ILIKE '%outbox%'), 0)::float8,
       coalesce(sum(s.rows), 0)::float8,
       coalesce(sum(s.total_exec_time), 0)::float8
FROM pg_stat_statements s
JOIN pg_roles r ON r.oid = s.userid
JOIN pg_database d ON d.oid = s.dbid
WHERE r.rolname <> $1 AND d.datname = $2`, benchWriterRole, db).Scan(&calls, &outboxCalls, &rows, &execMs)
	if err != nil {
		b.Fatal(err)
	}
	w.stmtsPerSec, w.outboxStmtsPerSec, w.rowsPerSec, w.execMsPerSec = calls/secs, outboxCalls/secs, rows/secs, execMs/secs
	w.cpuMsPerSec = pgtest.CPUSince(cpu0, cpu1) * 1000 / secs
	return w
}

// topStatements returns the n statements of roles other than the writer's
// in db that took the most execution time since pg_stat_statements was
// last reset, each query cut to its first 90 characters on one line.
func topStatements(b *testing.B, probe *pgxpool.Pool, db string, n int) []stmtWork {
	rows, err := probe.Query(context.Background(), `
SELECT left(regexp_replace(s.query, '\s+', ' ', 'g'), 90), s.calls, s.rows, s.total_exec_time,
       s.shared_blks_hit + s.shared_blks_read
FROM pg_stat_statements s
JOIN pg_roles r ON r.oid = s.userid
JOIN pg_database d ON d.oid = s.dbid
WHERE r.rolname <> $1 AND d.datname = $2
ORDER BY s.total_exec_time DESC LIMIT $3`, benchWriterRole, db, n)
	if err != nil {
		b.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stmtWork, error) {
		var w stmtWork
		err := r.Scan(&w.query, &w.calls, &w.rows, &w.execMs, &w.blocks)
		return w, err
	})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// relayCPU reads the CPU of each backend of the relay's sessions
// (application_name posthorn-relay, the WAL sender included).
func relayCPU(b *testing.B, probe *pgxpool.Pool) map[int]float64 {
	return pgtest.BackendCPU(b, probe, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, postgres.RelayApplicationName)
}
