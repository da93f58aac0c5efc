package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
	"github.com/posthorn/posthorn/relay/polling"
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
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sf := relaytest.StandbyFlush(required, store)
	reg := prometheus.NewRegistry()
	name := fmt.Sprintf("%s_%v", mode, required)
	var stop func()
	switch mode {
	case "polling":
		r, err := polling.New(store, sink, relay.Settings{Owner: name, SinkName: "memory", Logger: quiet, StandbyFlush: sf, Registerer: reg})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			b.Fatal(err)
		}
		stop = func() { _ = r.Stop(ctx) }
	case "cdc":
		logs := &syncbuf.Buffer{}
		slot := "bench_" + name
		r, err := cdc.New(store, cdcsource.New(relayPool), sink, relay.Settings{Owner: name, SinkName: "memory", CDC: relay.CDC{Slot: slot},
			Logger: slog.New(slog.NewTextHandler(logs, nil)), StandbyFlush: sf, Registerer: reg})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			b.Fatal(err)
		}
		stop = func() {
			_ = r.Stop(ctx)
			_, _ = f.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		}
		wait.For(b, 30*time.Second, "the CDC relay to stream", func() bool {
			return strings.Contains(logs.String(), "streaming the outbox")
		})
	}
	defer stop()
	var res standbyBenchResult

	if err := relaytest.Fill(ctx, f.Pool, name, 500, standbyBenchBacklog/500); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	wait.For(b, time.Minute, "the backlog drained", func() bool { return relaytest.Unrelayed(b, f.Pool) == 0 })
	res.drain = standbyBenchBacklog / time.Since(start).Seconds()

	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
	)
	waker := ledgerstore.NewRelayWaker(f.Pool)
	tokens := make(chan struct{}, standbyBenchRate)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-tokens:
				}
				a, c := fmt.Sprintf("lat-%d", (g*131+i*7)%400), fmt.Sprintf("lat-%d", (g*131+i*7+200)%400)
				ps, err := relaytest.Commit(ctx, f.Pool, a, c)
				now := time.Now()
				if err != nil {
					continue // a deadlock victim; the load moves on
				}
				waker.Wake()
				mu.Lock()
				for _, p := range ps {
					committed[p.EventID] = now
				}
				mu.Unlock()
			}
		}()
	}
	tick := time.NewTicker(10 * time.Millisecond)
	end := time.Now().Add(standbyBenchLoad)
	for now := range tick.C {
		if now.After(end) {
			break
		}
		for range standbyBenchRate / 100 {
			select {
			case tokens <- struct{}{}:
			default:
			}
		}
	}
	tick.Stop()
	close(done)
	wg.Wait()
	wait.For(b, time.Minute, "the load relayed", func() bool { return relaytest.Unrelayed(b, f.Pool) == 0 })
	lat := make([]time.Duration, 0, len(committed))
	for id, t := range committed {
		if a, ok := sink.Acked(id); ok {
			lat = append(lat, max(a.Sub(t), 0))
		}
	}
	if len(lat) != len(committed) || len(lat) == 0 {
		b.Fatalf("%s: %d of %d events ACKed", name, len(lat), len(committed))
	}
	slices.Sort(lat)
	res.p50, res.p99 = lat[len(lat)/2].Round(10*time.Microsecond), lat[len(lat)*99/100].Round(10*time.Microsecond)
	res.events = len(lat)
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if h := mf.GetMetric(); mf.GetName() == "posthorn_relay_standby_wait_seconds" && len(h) == 1 {
			res.waits = h[0].GetHistogram().GetSampleCount()
			if res.waits > 0 {
				res.meanWait = time.Duration(h[0].GetHistogram().GetSampleSum() / float64(res.waits) * float64(time.Second)).Round(10 * time.Microsecond)
			}
		}
	}
	return res
}
