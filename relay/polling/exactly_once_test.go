package polling_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// TestExactlyOnceRefusesASinkWithoutTransactions: exactly-once is never
// silently off; a sink that cannot publish in fenced transactions is
// refused when the relay is made.
func TestExactlyOnceRefusesASinkWithoutTransactions(t *testing.T) {
	_, err := polling.New(nil, memory.New(memory.Config{}), relay.Settings{ExactlyOnce: true})
	if !errors.Is(err, relay.ErrInvalidConfig) {
		t.Fatalf("exactly-once over the memory sink: %v, want ErrInvalidConfig", err)
	}
}

// A fence that waits on a transaction coordinator out of reach gives up in
// time for the relay to renew its leases: they never lapse while it stalls
// (before, the fence ran to the leases' deadline and the relay renewed
// after it, so each stalled fence let them lapse and another relay took
// them over, to meet the same coordinator), and once the coordinator
// answers the relay publishes.
func TestAStalledFenceKeepsTheLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, memory.Config{})
	sink := &relaytest.StallingFencedSink{Sink: f.sink}
	sink.Stalled.Store(true)
	f.wrap = sink
	f.start("relay-a", func(c *relay.Settings) { c.ExactlyOnce = true })
	held := func() (int, bool) {
		var n int
		var lapsed bool
		if err := f.pool.QueryRow(ctx, `SELECT count(*), coalesce(bool_or(expires_at <= clock_timestamp()), false)
FROM relay_leases WHERE owner = 'relay-a'`).Scan(&n, &lapsed); err != nil {
			t.Fatal(err)
		}
		return n, lapsed
	}
	wait.For(t, 10*time.Second, "the relay's leases", func() bool { n, _ := held(); return n == core.Shards })
	// Three leases' time (2 s each) of stalled fences.
	sink.KeepsLeaseWhileStalled(t, 6*time.Second, func() bool { _, lapsed := held(); return lapsed })
	posted := relaytest.MustPostN(t, f.pool, 20, 5)
	f.waitDelivered(len(posted))
}
