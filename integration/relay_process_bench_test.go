package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// BenchmarkRelayDrainProcessFactors takes apart why `posthorn relay` as its
// own process, with `posthorn dev kafka` on a data directory, drained a
// 200,000-event backlog at about half the rate of the in-process relay of
// BenchmarkRelayDrainVsStockForwarder: the same backlog
// drained side by side, one factor changed at a time. Each rate is taken
// from the relay's start (a process: its launch) to the empty queue. It
// takes about two minutes, so it runs only when asked:
//
//	POSTHORN_BENCH_1M=1 go test -run '^$' -bench 'RelayDrainProcessFactors' -benchtime 1x -timeout 30m ./integration/
func BenchmarkRelayDrainProcessFactors(b *testing.B) {
	pgtest.Require1M(b, "drains a 200,000-event backlog eight times (minutes)")
	inMemory := func(b *testing.B) []string { return benchKfake(b, 16) }
	// The dev broker as its own process, 16 partitions like benchKfake;
	// dataDir false keeps its log in memory.
	devBroker := func(dataDir bool) func(b *testing.B) []string {
		return func(b *testing.B) []string {
			addr, dir := freeAddr(b), b.TempDir()
			args := []string{"dev", "kafka", "--listen", addr, "--partitions", "16"}
			if dataDir {
				args = append(args, "--data-dir", filepath.Join(dir, "data"))
			}
			broker := faultkit.NewProc(faultkit.ProcConfig{Name: "broker", Bin: posthornBin(b), LogDir: dir, Args: args,
				ReadyLine: "kafka-protocol broker listening on"})
			if err := broker.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(broker.Close)
			return []string{addr}
		}
	}
	cases := []struct {
		name    string
		brokers func(*testing.B) []string
		// conns is the in-process relay's pool size; 0 runs `posthorn relay`.
		conns int32
		// stats is the in-process relay's StatsInterval: make bench's
		// relay refreshes its backlog gauges once a minute, posthorn relay
		// every relay.StatsIntervalDefault.
		stats time.Duration
	}{
		{"in-process relay, pool of 16, kfake in-process, stats 1 min (make bench)", inMemory, 16, time.Minute},
		{"in-process relay, pool of 4 (as posthorn relay's)", inMemory, 4, time.Minute},
		{"in-process relay, stats every 2 s (as posthorn relay's)", inMemory, 16, relay.StatsIntervalDefault},
		{"posthorn relay process, kfake in-process", inMemory, 0, 0},
		{"in-process relay, dev broker process in memory", devBroker(false), 16, time.Minute},
		{"in-process relay, dev broker process on a data dir", devBroker(true), 16, time.Minute},
		{"posthorn relay process, dev broker process in memory", devBroker(false), 0, 0},
		{"posthorn relay process, dev broker process on a data dir (the report)", devBroker(true), 0, 0},
		{"in-process relay, pool of 16, kfake in-process, stats 1 min (again)", inMemory, 16, time.Minute},
	}
	for _, c := range cases {
		rate, ready, afterReady := drainFactor(b, c.brokers(b), c.conns, c.stats)
		fmt.Printf("relay drain factors: %-74s %7.0f events/s (ready after %.2fs; %7.0f events/s from then)\n", c.name, rate, ready.Seconds(), afterReady)
	}
}

// drainFactor fills a fresh ledger with drainEvents events and drains them
// to brokers with an in-process relay on a pool of conns connections
// refreshing its gauges every stats, or (conns 0) with `posthorn relay`.
// It returns the rate from the start, how long the relay took to be ready
// (a process: launched, connected, serving /readyz), and the rate of the
// events relayed after that.
func drainFactor(b *testing.B, brokers []string, conns int32, stats time.Duration) (rate float64, ready time.Duration, afterReady float64) {
	ctx := context.Background()
	url, pool := backlogLedger(b, "drain", drainEvents)
	var proc *faultkit.Proc
	if conns == 0 {
		proc, _ = relayProcess(b, url, brokers) // builds the binary on first use: before the clock starts
	}
	start := time.Now()
	if conns == 0 {
		if err := proc.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer proc.Close()
	} else {
		sink, err := kafkaSink(brokers)
		if err != nil {
			b.Fatal(err)
		}
		defer sink.Close()
		r := startRelay(b, pgtest.SmallPool(b, url, conns), sink, relay.Settings{Owner: "bench", SinkName: "kafka", Logger: relayQuietLog,
			Registerer: prometheus.NewRegistry(), StatsInterval: stats})
		defer r.Stop(ctx)
	}
	ready = time.Since(start)
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_pending`).Scan(&left); err != nil {
		b.Fatal(err)
	}
	wait.For(b, 5*time.Minute, "the relay to drain the backlog", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM outbox_pending LIMIT 1) x`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n == 0
	})
	took := time.Since(start)
	return drainEvents / took.Seconds(), ready, float64(left) / (took - ready).Seconds()
}
