package polling_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// runPolling starts a polling relay on f's primary (relaytest.RunRelay),
// logging into logs when it is not nil.
func runPolling(logs *syncbuf.Buffer) relaytest.RunRelay {
	return func(t testing.TB, f *relaytest.Failover, required bool) (prometheus.Gatherer, func()) {
		t.Helper()
		log := quiet
		if logs != nil {
			log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}
		reg := prometheus.NewRegistry()
		stop := sync.OnceFunc(relaytest.StartMode(t, relay.ModePolling, f.Pool, f.Sink, relay.Settings{
			Owner: "failover", SinkName: "memory", BatchSize: 100, PollInterval: 50 * time.Millisecond,
			LeaseTTL: 2 * time.Second, RetryInitial: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
			StatsInterval: 50 * time.Millisecond, Logger: log, Registerer: reg,
			StandbyFlush: relaytest.StandbyFlush(required, relaystore.New(f.Pool)),
		}))
		t.Cleanup(stop)
		return reg, stop
	}
}

// With standby_flush required, postings commit while the standby is down
// but nothing of them is published, visibly (gauge, log), until the
// standby is back; then all of it is. The start check refuses a role that
// cannot read the standbys' positions and warns about a ledger whose
// standbys nothing waits for.
func TestStandbyFlushHoldsTheRelayWhileTheStandbyIsDown(t *testing.T) {
	f := relaytest.NewFailover(t, pgcluster.Options{})
	ctx := context.Background()
	store := relaystore.New(f.Pool)

	// The start check, on this ledger with one asynchronous standby.
	check := func(sf relay.StandbyFlush) (string, error) {
		var b syncbuf.Buffer
		err := relay.CheckStandbys(ctx, sf, slog.New(slog.NewTextHandler(&b, nil)))
		return b.String(), err
	}
	if out, err := check(relay.StandbyFlush{Probe: store}); err != nil ||
		!strings.Contains(out, "neither synchronous replication") || !strings.Contains(out, relaytest.StandbyName) {
		t.Errorf("no warning about an unguarded standby at start (%v):\n%s", err, out)
	}
	if out, err := check(relay.StandbyFlush{Policy: relay.StandbyRequired, Probe: store}); err != nil || out != "" {
		t.Errorf("standby flush required, the standby streaming: %v, logs:\n%s", err, out)
	}
	if out, err := check(relay.StandbyFlush{Policy: relay.StandbyRequired, Names: []string{"nowhere"}, Probe: store}); err != nil || !strings.Contains(out, "nowhere") {
		t.Errorf("no warning about a named standby that is not streaming (%v):\n%s", err, out)
	}
	if _, err := f.Pool.Exec(ctx, `CREATE ROLE no_stats LOGIN`); err != nil {
		t.Fatal(err)
	}
	noStats := relaystore.New(pgtest.Pool(t, strings.Replace(f.URL, "://"+f.Primary.User()+"@", "://no_stats@", 1), 2))
	if _, err := check(relay.StandbyFlush{Policy: relay.StandbyRequired, Probe: noStats}); err == nil || !strings.Contains(err.Error(), "pg_read_all_stats") {
		t.Errorf("a role that cannot read pg_stat_replication: %v, want an error naming pg_read_all_stats", err)
	}
	if _, err := check(relay.StandbyFlush{Probe: noStats}); err != nil {
		t.Errorf("the same role with standby flush off: %v", err)
	}

	var logs syncbuf.Buffer
	reg, _ := runPolling(&logs)(t, f, true)
	first := relaytest.MustPostTransfers(t, f.Pool, 5, 8, 3)
	wait.For(t, 30*time.Second, "the first events published", func() bool {
		return len(relaytest.Delivered(t, f.Sink)) >= len(first)
	})
	if err := f.Standby.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	held := relaytest.MustPostTransfers(t, f.Pool, 10, 8, 5)
	wait.For(t, 30*time.Second, "the relay to report it is held by the standby", func() bool {
		return promtest.Value(t, reg, "posthorn_relay_held_by_standby_seconds") >= 1 &&
			strings.Contains(logs.String(), "relay held back by the ledger's standbys")
	})
	if got := len(relaytest.Delivered(t, f.Sink)); got != len(first) {
		t.Fatalf("%d events published while the standby was down, want only the %d before", got-len(first), len(first))
	}
	if err := f.Standby.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the held events published once the standby is back", func() bool {
		return len(relaytest.Delivered(t, f.Sink)) >= len(first)+len(held)
	})
	wait.For(t, 10*time.Second, "the held gauge back to 0", func() bool {
		return promtest.Value(t, reg, "posthorn_relay_held_by_standby_seconds") == 0
	})
	if !strings.Contains(logs.String(), "the standbys caught up; publishing again") {
		t.Errorf("no log line when the hold ended:\n%s", logs.String())
	}
	if n, _ := promtest.Histogram(t, reg, "posthorn_relay_standby_wait_seconds"); n < 2 {
		t.Errorf("standby waits observed: %v, want at least 2", n)
	}
}

// The failover: the standby misses the last postings and is promoted after
// the primary is killed. With standby_flush required, every event the
// relay published is in the promoted ledger; the negative control (off)
// published events the new primary lacks: ghosts.
func TestStandbyFlushLeavesNoGhostAfterFailover(t *testing.T) {
	relaytest.NoGhostAfterFailover(t, runPolling(nil), pgcluster.Options{}, nil)
}

// The relay refuses a required standby flush it could not carry out, and
// names the setting.
func TestStandbyFlushConfigIsValidated(t *testing.T) {
	for key, sf := range map[string]relay.StandbyFlush{
		"StandbyFlush.Probe": {Policy: relay.StandbyRequired},
		"standby_count":      {Policy: relay.StandbyRequired, Names: []string{"a"}, Count: 2, Probe: fakeProbe{}},
		"standby_names[1]":   {Policy: relay.StandbyRequired, Names: []string{"a", "a"}, Probe: fakeProbe{}},
		"standby_flush":      {Policy: "yes", Probe: fakeProbe{}},
	} {
		_, err := polling.New(nil, nil, relay.Settings{StandbyFlush: sf})
		if !errors.Is(err, relay.ErrInvalidConfig) || !strings.Contains(err.Error(), key+" ") {
			t.Errorf("%+v: %v, want an error naming %s", sf, err, key)
		}
	}
}

type fakeProbe struct{}

func (fakeProbe) StandbyStatus(context.Context) (relay.StandbyStatus, error) {
	return relay.StandbyStatus{}, nil
}

func (fakeProbe) ReplicationSettings(context.Context) (string, bool, error) {
	return "", true, nil
}
