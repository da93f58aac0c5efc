package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

const (
	standbyBenchBacklog = 20_000 // events committed at once for the drain figure
	standbyBenchRate    = 200    // postings per second (two events each) for the latency figure
	standbyBenchLoad    = 4 * time.Second
)

type standbyBenchResult struct {
	drain    float64 // events per second
	p50, p99 time.Duration
	events   int
	// waits and meanWait are the batches that waited for the standby and
	// their mean wait (posthorn_relay_standby_wait_seconds), over the run.
	waits    uint64
	meanWait time.Duration
}

// BenchmarkStandbyFlush measures what relay.standby_flush: required costs
// against off, side by side in one run on one throwaway primary (wal_level
// logical, synchronous_commit on) with an asynchronous standby on
// loopback, in both relay modes, with the in-memory sink:
//
//   - drain: one transaction commits 20,000 events; events per second
//     until all are ACKed and marked;
//   - commit-to-ACK p50/p99 at 200 two-event postings per second for 4 s
//     (4 writers), from the writer's commit returning to the sink's ACK.
func BenchmarkStandbyFlush(b *testing.B) {
	f := relaytest.NewFailover(b, pgcluster.Options{Logical: true})
	type key struct {
		mode     string
		required bool
	}
	results := map[key]standbyBenchResult{}
	modes := []string{"polling", "cdc"}
	for range b.N {
		for _, mode := range modes {
			for _, required := range []bool{false, true} {
				results[key{mode, required}] = benchStandby(b, f, mode, required)
			}
		}
	}
	fmt.Printf("\nrelay.standby_flush off vs required (memory sink, one asynchronous standby on loopback, PostgreSQL 15, 2 shared cores):\n")
	for _, mode := range modes {
		off, req := results[key{mode, false}], results[key{mode, true}]
		fmt.Printf("%-8s drain of a %d-event commit: off %7.0f events/s, required %7.0f events/s (required/off %.2f)\n",
			mode, standbyBenchBacklog, off.drain, req.drain, req.drain/off.drain)
		fmt.Printf("%-8s commit-to-ACK at %d postings/s: off p50 %s p99 %s, required p50 %s p99 %s (p50 +%s, p99 +%s)\n",
			mode, standbyBenchRate, off.p50, off.p99, req.p50, req.p99, req.p50-off.p50, req.p99-off.p99)
		fmt.Printf("%-8s required: %d batches waited for the standby, %s each on average\n", mode, req.waits, req.meanWait)
		b.ReportMetric(req.drain/off.drain, mode+"-drain-required/off")
		b.ReportMetric(float64((req.p50-off.p50).Microseconds())/1000, mode+"-p50-added-ms")
	}
}

func benchStandby(b *testing.B, f *relaytest.Failover, mode string, required bool) standbyBenchResult {
	ctx := context.Background()
	relayPool, err := postgres.Connect(ctx, f.URL+"&application_name="+postgres.RelayApplicationName, 8)
	if err != nil {
		b.Fatal(err)
	}
	defer relayPool.Close()
	store := relaystore.New(relayPool)
	sink := relaytest.NewAckTimes(memory.New(memory.Config{}))
	defer sink.Close()
	sf := relaytest.StandbyFlush(required, store)
	reg := prometheus.NewRegistry()
	name := fmt.Sprintf("%s_%v", mode, required)
	stop := relaytest.StartMode(b, mode, relayPool, sink, relay.Settings{Owner: name, SinkName: "memory", CDC: relay.CDC{Slot: "bench_" + name},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StandbyFlush: sf, Registerer: reg})
	defer func() {
		stop()
		if mode == relay.ModeCDC {
			_, _ = f.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, "bench_"+name)
		}
	}()
	var res standbyBenchResult

	if err := relaytest.Fill(ctx, f.Pool, name, 500, standbyBenchBacklog/500); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	wait.For(b, time.Minute, "the backlog drained", func() bool { return relaytest.Unrelayed(b, f.Pool) == 0 })
	res.drain = standbyBenchBacklog / time.Since(start).Seconds()

	load := relaytest.RunLoad(ctx, f.Pool, standbyBenchRate, 4, standbyBenchLoad, "lat", 400)
	wait.For(b, time.Minute, "the load relayed", func() bool { return relaytest.Unrelayed(b, f.Pool) == 0 })
	lat := load.Latencies(b, sink)
	p50, p99 := relaytest.Percentiles(lat)
	res.p50, res.p99 = p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond)
	res.events = len(lat)
	var sum float64
	res.waits, sum = promtest.Histogram(b, reg, "posthorn_relay_standby_wait_seconds")
	if res.waits > 0 {
		res.meanWait = time.Duration(sum / float64(res.waits) * float64(time.Second)).Round(10 * time.Microsecond)
	}
	return res
}
