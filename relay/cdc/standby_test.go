package cdc_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/relay"
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
		stop := sync.OnceFunc(relaytest.StartMode(t, relay.ModeCDC, f.Pool, f.Sink, failoverCDCConfig("failover", relaystore.New(f.Pool), logs, reg, required)))
		t.Cleanup(stop)
		return reg, stop
	}
}

// The failover of the polling relay's test, in CDC mode: with standby_flush
// required each streamed transaction waits until the standby has flushed
// its commit, so every event published is in the promoted ledger; the
// negative control (off) leaves ghosts.
func TestStandbyFlushLeavesNoGhostAfterFailoverCDC(t *testing.T) {
	var logs *syncbuf.Buffer // each run's
	run := func(t testing.TB, f *relaytest.Failover, required bool) (prometheus.Gatherer, func()) {
		logs = &syncbuf.Buffer{}
		return runCDC(logs)(t, f, required)
	}
	relaytest.NoGhostAfterFailover(t, run, pgcluster.Options{Logical: true}, func(t *testing.T, required bool, res relaytest.FailoverResult) {
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
