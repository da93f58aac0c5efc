package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
)

// BenchmarkRelayMemory1M drains a backlog of 1,000,000 events with
// `posthorn relay` as its own process (the Kafka sink to kfake, which runs
// in the benchmark's process so that its copy of the records is not
// counted) and prints the relay's resident memory (VmRSS of
// /proc/<pid>/status) and Go heap in use (its /metrics) once 100,000,
// 500,000 and 1,000,000 events are relayed, plus the peak (VmHWM). The
// issue asks that they stay flat. Loading the backlog takes about a
// minute, so it runs only when asked:
//
//	POSTHORN_BENCH_1M=1 go test -run '^$' -bench 'RelayMemory1M' -benchtime 1x -timeout 30m ./integration/
func BenchmarkRelayMemory1M(b *testing.B) {
	pgtest.Require1M(b, "loads 1,000,000 events (minutes)")
	const events = 1_000_000
	ctx := context.Background()
	url, pool := backlogLedger(b, "mem", events)
	relay, metrics := relayProcess(b, url, benchKfake(b, 16))
	b.ResetTimer()
	start := time.Now()
	if err := relay.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer relay.Close()
	marks := []int{100_000, 500_000, 1_000_000}
	for len(marks) > 0 {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_pending`).Scan(&pending); err != nil {
			b.Fatal(err)
		}
		relayed := events - pending
		if relayed < marks[0] {
			if time.Since(start) > 10*time.Minute {
				b.Fatalf("only %d of %d events relayed after 10 minutes", relayed, events)
			}
			time.Sleep(50 * time.Millisecond) // the sampling pace, not a synchronisation
			continue
		}
		for len(marks) > 0 && relayed >= marks[0] {
			marks = marks[1:]
		}
		status := procStatus(b, relay.Pid())
		heap := metricValue(b, "http://"+metrics+"/metrics", "go_memstats_heap_inuse_bytes")
		fmt.Printf("relay memory: %7d events relayed after %5.1fs: VmRSS %6.1f MiB, VmHWM %6.1f MiB, Go heap in use %6.1f MiB\n",
			relayed, time.Since(start).Seconds(), status["VmRSS"]/1024, status["VmHWM"]/1024, heap/(1<<20))
		b.ReportMetric(status["VmRSS"]/1024, fmt.Sprintf("MiB-rss@%dk", relayed/1000))
	}
	fmt.Printf("relay memory: drained %d events in %.1fs = %.0f events/s (relay process, kfake in the benchmark's process)\n",
		events, time.Since(start).Seconds(), events/time.Since(start).Seconds())
}

// backlogLedger is a fresh ledger holding a backlog of events unrelayed
// events on 2,000 accounts (relaytest.Fill with prefix), vacuumed and
// analyzed, so that the relay's reads are planned on its real size.
func backlogLedger(b *testing.B, prefix string, events int) (string, *pgxpool.Pool) {
	ctx := context.Background()
	url, pool := pgtest.Ledger(b)
	if err := relaytest.Fill(ctx, pool, prefix, 2000, events/2000); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox, outbox_pending`); err != nil {
		b.Fatal(err)
	}
	return url, pool
}

// relayProcess is `posthorn relay` on the ledger at url with the Kafka
// sink to brokers, not started, and the address of its metrics.
func relayProcess(b *testing.B, url string, brokers []string) (*faultkit.Proc, string) {
	metrics := freeAddr(b)
	return faultkit.NewProc(faultkit.ProcConfig{Name: "relay", Bin: posthornBin(b), Args: []string{"relay"}, LogDir: b.TempDir(),
		Env: []string{"POSTHORN_DATABASE__URL=" + url, "POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=" + strings.Join(brokers, ","),
			"POSTHORN_METRICS__LISTEN=" + metrics, "POSTHORN_LOG__LEVEL=warn"},
		Ready: faultkit.HTTPReady("http://" + metrics + "/readyz")}), metrics
}

// procStatus reads the kB figures of /proc/<pid>/status (VmRSS, VmHWM, …).
func procStatus(b *testing.B, pid int) map[string]float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if fields := strings.Fields(rest); ok && len(fields) == 2 && fields[1] == "kB" {
			out[name], _ = strconv.ParseFloat(fields[0], 64)
		}
	}
	return out
}

// metricValue is the value of an unlabelled metric on a Prometheus text
// endpoint.
func metricValue(b *testing.B, url, name string) float64 {
	_, body := promtest.Get(b, url)
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				b.Fatal(err)
			}
			return f
		}
	}
	b.Fatalf("%s: no %s", url, name)
	return 0
}
