package cdc_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
)

// A session's fence that waits on a transaction coordinator out of reach
// gives up in time for the next session to renew the slot's lease: it
// never lapses while the fences stall (before, the fence ran to the
// lease's end, so a standby relay would have taken the slot over to meet
// the same coordinator), and once the coordinator answers the relay
// streams and delivers.
func TestAStalledFenceKeepsTheSlotLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, nil)
	sink := &relaytest.StallingFencedSink{Sink: f.sink}
	sink.Stalled.Store(true)
	cfg := relay.Settings{
		Owner: "relay-a", SinkName: "memory", ExactlyOnce: true,
		CDC:       relay.CDC{Slot: f.slot, StatusInterval: 200 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond},
		BatchSize: 500, LeaseTTL: 2 * time.Second, RetryInitial: 10 * time.Millisecond, RetryMax: 2 * time.Second,
		StatsInterval: 100 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	r, err := cdc.New(f.store, f.source, sink, cfg)
	if err != nil {
		t.Fatal(err)
	}
	relaytest.Start(t, r)
	held := func() (owned, lapsed bool) {
		if err := f.pool.QueryRow(ctx, `SELECT coalesce(bool_or(owner = 'relay-a'), false), coalesce(bool_or(expires_at <= clock_timestamp()), false)
FROM relay_cdc_leases WHERE slot = $1`, f.slot).Scan(&owned, &lapsed); err != nil {
			t.Fatal(err)
		}
		return owned, lapsed
	}
	wait.For(t, 30*time.Second, "the slot's lease", func() bool { owned, _ := held(); return owned })
	// Three leases' time (2 s each) of stalled fences, with the backoff
	// growing to a whole lease.
	sink.KeepsLeaseWhileStalled(t, 6*time.Second, func() bool { _, lapsed := held(); return lapsed })
	posted := relaytest.MustPostN(t, f.pool, 20, 5)
	f.waitAllDelivered(posted, 30*time.Second)
}
