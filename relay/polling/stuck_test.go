package polling_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// errUnroutable stands for a failure the sink calls retryable that never
// heals for this record (RabbitMQ's unroutable, a topic never writable).
var errUnroutable = errors.New("NO_ROUTE: message unroutable")

// stuckSink fails the records of one account retryably, one by one, and
// forwards the rest to the memory sink; with all set, every record fails
// the same way (a broker-wide outage that still answers per record).
type stuckSink struct {
	inner   *memory.Sink
	account atomic.Value // string
	all     atomic.Bool
}

func (s *stuckSink) Publish(ctx context.Context, batch []core.Envelope) error {
	acc, _ := s.account.Load().(string)
	failed := map[int]error{}
	var pass []core.Envelope
	for i, e := range batch {
		if s.all.Load() || e.AggregateID == acc {
			failed[i] = errUnroutable
			continue
		}
		pass = append(pass, e)
	}
	if len(pass) > 0 {
		if err := s.inner.Publish(ctx, pass); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return &core.BatchError{Failed: failed}
	}
	return nil
}

func (s *stuckSink) Close() error { return nil }

func newStuckFixture(t *testing.T, account string) (*fixture, *stuckSink) {
	f := newFixture(t, memory.Config{})
	ss := &stuckSink{inner: f.sink}
	ss.account.Store(account)
	f.wrap = ss
	return f, ss
}

func deliveredIDs(f *fixture) map[string]bool {
	m := map[string]bool{}
	for _, e := range f.delivered() {
		m[e.EventID] = true
	}
	return m
}

// postSequentially posts n events of account one after the other, each
// once the previous one is in the sink, and returns how long that took:
// the latency a relay that backs off every batch imposes on everyone.
func postSequentially(t *testing.T, f *fixture, account string, n int) time.Duration {
	t.Helper()
	start := time.Now()
	for range n {
		p := relaytest.MustPost(t, f.pool, account)
		wait.For(t, 30*time.Second, "a posting of "+account, func() bool { return deliveredIDs(f)[p[0].EventID] })
	}
	return time.Since(start)
}

// throttleCfg backs off for long enough that a relay which backs off every
// batch is visibly slow: 1 s at the most, from 200 ms; it parks after
// attempts (0: never) and never for time.
func throttleCfg(attempts int) func(*relay.Settings) {
	return func(c *relay.Settings) {
		c.RetryInitial, c.RetryMax = 200*time.Millisecond, time.Second
		c.ParkAfterAttempts, c.ParkAfter = attempts, 0
	}
}

// One record failing retryably for ever parks its aggregate after the
// bounded attempts, with the last error as reason; the others keep flowing
// without backoff.
func TestStuckRetryableRecordParksItsAggregateOnly(t *testing.T) {
	t.Parallel()
	f, ss := newStuckFixture(t, "acc-stuck")
	stuck := relaytest.MustPost(t, f.pool, "acc-stuck")
	relaytest.MustPost(t, f.pool, "acc-stuck")
	var good []relaytest.Posted
	for range 10 {
		good = append(good, relaytest.MustPost(t, f.pool, "acc-1", "acc-2")...)
	}
	r := f.start("relay", throttleCfg(3))
	wait.For(t, 30*time.Second, "acc-stuck parked", func() bool {
		return promtest.Value(t, r.reg, "posthorn_relay_parked_aggregates") == 1
	})
	parked, err := f.store.Parked(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].AggregateID != "acc-stuck" || parked[0].EventID != stuck[0].EventID ||
		!strings.Contains(parked[0].Reason, errUnroutable.Error()) || !strings.Contains(parked[0].Reason, "3 attempts") {
		t.Fatalf("parked %+v, want acc-stuck at %s with the last error", parked, stuck[0].EventID)
	}
	ids := deliveredIDs(f)
	for _, p := range good {
		if !ids[p.EventID] {
			t.Fatalf("event %s of %s not delivered", p.EventID, p.Account)
		}
	}
	// No more backoff for the others.
	if took := postSequentially(t, f, "acc-3", 3); took > 1200*time.Millisecond {
		t.Fatalf("3 postings of another account took %s after the park; the relay still backs off", took)
	}
	// The cause fixed, a release sends acc-stuck's records in order.
	ss.account.Store("")
	if err := f.store.Release(context.Background(), core.AggregateAccount, "acc-stuck"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "released acc-stuck relayed", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
	relaytest.CheckOrder(t, f.delivered(), false)
}

// The negative control: with the retry-park bounds off (the old
// behaviour), the same record backs off every batch for ever, so every
// other account waits out the backoff too.
func TestStuckRetryableRecordNegativeControlThrottlesEveryone(t *testing.T) {
	t.Parallel()
	f, _ := newStuckFixture(t, "acc-stuck")
	relaytest.MustPost(t, f.pool, "acc-stuck")
	r := f.start("relay", throttleCfg(0))
	wait.For(t, 30*time.Second, "backoff at its maximum", func() bool {
		return promtest.Value(t, r.reg, "posthorn_relay_retries_total") >= 4
	})
	if took := postSequentially(t, f, "acc-3", 3); took < 1200*time.Millisecond {
		t.Fatalf("3 postings of another account took only %s behind a stuck record: the control did not throttle", took)
	}
	if n := promtest.Value(t, r.reg, "posthorn_relay_parked_aggregates"); n != 0 {
		t.Fatalf("control parked %v aggregates", n)
	}
}

// A broker-wide outage, every record failing retryably, only backs off:
// far more attempts than the bound park nothing, and everything flows once
// the broker is back.
func TestBrokerWideOutageBacksOffNeverParks(t *testing.T) {
	t.Parallel()
	f, ss := newStuckFixture(t, "")
	ss.all.Store(true)
	var posted []relaytest.Posted
	for i := range 20 {
		posted = append(posted, relaytest.MustPost(t, f.pool, "acc-"+string(rune('a'+i%5)))...)
	}
	r := f.start("relay", func(c *relay.Settings) { c.ParkAfterAttempts, c.ParkAfter = 2, 50*time.Millisecond })
	wait.For(t, 30*time.Second, "many retries", func() bool {
		if p, _ := f.store.Parked(context.Background()); len(p) > 0 {
			t.Fatalf("the outage parked %d aggregates, e.g. %+v", len(p), p[0])
		}
		return promtest.Value(t, r.reg, "posthorn_relay_retries_total") >= 10
	})
	if p, err := f.store.Parked(context.Background()); err != nil || len(p) != 0 {
		t.Fatalf("outage parked %+v (%v)", p, err)
	}
	ss.all.Store(false)
	f.waitDelivered(len(posted))
	wait.For(t, 30*time.Second, "markers", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
	if p, _ := f.store.Parked(context.Background()); len(p) != 0 {
		t.Fatalf("parked after the outage: %+v", p)
	}
}
