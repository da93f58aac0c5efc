package cdc_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
)

// failoverCDCConfig is the CDC relay of the failover tests, named name,
// logging to logs and reporting to reg, reading the standbys through store.
func failoverCDCConfig(name string, store relay.StandbyProbe, logs *syncbuf.Buffer, reg prometheus.Registerer, required bool) relay.Settings {
	return relay.Settings{
		Owner: name, SinkName: "memory", BatchSize: 100, LeaseTTL: 2 * time.Second,
		RetryInitial: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, StatsInterval: 100 * time.Millisecond,
		CDC:          relay.CDC{Slot: name, StatusInterval: 200 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond},
		Logger:       slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Registerer:   reg,
		StandbyFlush: relaytest.StandbyFlush(required, store),
	}
}

// runCDC starts a CDC relay on f's primary (relaytest.RunRelay).
func runCDC(logs *syncbuf.Buffer) relaytest.RunRelay {
	return func(t testing.TB, f *relaytest.Failover, required bool) (prometheus.Gatherer, func()) {
		t.Helper()
		reg := prometheus.NewRegistry()
		store := relaystore.New(f.Pool)
		r, err := cdc.New(store, cdcsource.New(f.Pool), f.Sink, failoverCDCConfig("failover", store, logs, reg, required))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 30*time.Second, "the relay to stream", func() bool {
			return strings.Contains(logs.String(), "streaming the outbox from the slot")
		})
		stop := sync.OnceFunc(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = r.Stop(ctx)
		})
		t.Cleanup(stop)
		return reg, stop
	}
}

// The failover of the polling relay's test, in CDC mode: with standby_flush
// required each streamed transaction waits until the standby has flushed
// its commit, so every event published is in the promoted ledger; the
// negative control (off) leaves ghosts.
func TestStandbyFlushLeavesNoGhostAfterFailoverCDC(t *testing.T) {
	for _, required := range []bool{true, false} {
		t.Run(fmt.Sprintf("required=%v", required), func(t *testing.T) {
			logs := &syncbuf.Buffer{}
			res := relaytest.RunFailover(t, runCDC(logs), required, pgcluster.Options{Logical: true})
			t.Logf("standby_flush required=%v: %d events published, %d of them absent from the promoted standby", required, res.Published, len(res.Ghosts))
			if res.Published < 20 {
				t.Fatalf("%d events published, want at least the 20 committed while the standby streamed", res.Published)
			}
			if required && len(res.Ghosts) > 0 {
				t.Errorf("%d ghosts (published, absent from the new primary) with standby flush required: %v", len(res.Ghosts), res.Ghosts)
			}
			if !required && len(res.Ghosts) == 0 {
				t.Errorf("negative control: with standby flush off the failover left no ghost; the scenario does not bite")
			}
			// The relay's own logical WAL sender was in pg_stat_replication
			// and the probe did not take it for a standby.
			if res.WALSenders < 1 {
				t.Errorf("pg_stat_replication had %d rows while the standby was down, want the CDC relay's WAL sender", res.WALSenders)
			}
			if required && !strings.Contains(logs.String(), "relay held back by the ledger's standbys") {
				t.Errorf("no log line while the relay was held:\n%s", logs)
			}
		})
	}
}
