package polling_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// fixture is one ledger database, a memory sink and relays over them.
type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *relaystore.Store
	sink  *memory.Sink
	// wrap, when set, is the sink the relays publish to (it forwards to sink).
	wrap core.Sink
}

func newFixture(t *testing.T, sinkCfg memory.Config) *fixture {
	t.Helper()
	_, pool := pgtest.Ledger(t)
	s := memory.New(sinkCfg)
	t.Cleanup(func() { _ = s.Close() })
	return &fixture{t: t, pool: pool, store: relaystore.New(pool), sink: s}
}

type relayHandle struct {
	*polling.Relay
	reg *prometheus.Registry
}

// start starts a relay named owner with the fixture's settings, changed by
// mod (nil: none), and hooks (nil: none).
func (f *fixture) start(owner string, mod func(*relay.Settings), hooks ...*polling.Hooks) relayHandle {
	f.t.Helper()
	reg := prometheus.NewRegistry()
	cfg := relay.Settings{
		Owner:         owner,
		SinkName:      "memory",
		BatchSize:     500,
		PollInterval:  50 * time.Millisecond,
		LeaseTTL:      2 * time.Second,
		RetryInitial:  10 * time.Millisecond,
		RetryMax:      100 * time.Millisecond,
		StatsInterval: 50 * time.Millisecond,
		Logger:        quiet,
		Registerer:    reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	var sink core.Sink = f.sink
	if f.wrap != nil {
		sink = f.wrap
	}
	var h *polling.Hooks
	if len(hooks) > 0 {
		h = hooks[0]
	}
	r, err := polling.NewWithHooks(f.store, sink, cfg, h)
	if err != nil {
		f.t.Fatal(err)
	}
	relaytest.Start(f.t, r)
	return relayHandle{r, reg}
}

// delivered returns the envelopes the sink holds on ledger.events, in order.
func (f *fixture) delivered() []core.Envelope { return relaytest.Delivered(f.t, f.sink) }

func (f *fixture) waitDelivered(n int) []core.Envelope {
	f.t.Helper()
	wait.For(f.t, 20*time.Second, fmt.Sprintf("%d records in the sink", n), func() bool {
		return len(f.sink.Records(core.TopicEvents)) >= n
	})
	return f.delivered()
}

func TestEveryCommittedEventNoneRolledBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	committed := relaytest.MustPostTransfers(t, f.pool, 60, 13, 5)
	rolledBack := map[string]bool{}
	for i := range 10 {
		rolledBack[relaytest.MustRollBack(t, f.pool, fmt.Sprintf("acc-%d", i))[0].EventID] = true
	}
	r := f.start("relay-a", nil)
	// Rows committed while the relay runs are found by its poll (relaytest
	// writes without ledgerstore.Store, so no NOTIFY wakes the relay).
	committed = append(committed, relaytest.MustPostN(t, f.pool, 40, 13)...)
	got := f.waitDelivered(len(committed))
	wait.For(t, 10*time.Second, "all markers", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
	if len(got) != len(committed) {
		t.Fatalf("delivered %d, committed %d", len(got), len(committed))
	}
	ids := map[string]bool{}
	for _, e := range got {
		if rolledBack[e.EventID] {
			t.Fatalf("event %s of a rolled-back transaction was delivered", e.EventID)
		}
		ids[e.EventID] = true
	}
	for _, p := range committed {
		if !ids[p.EventID] {
			t.Fatalf("committed event %s (%s r%d) not delivered", p.EventID, p.Account, p.Revision)
		}
	}
	relaytest.CheckOrder(t, got, false)
	if n := promtest.Value(t, r.reg, "posthorn_relay_published_total"); n != float64(len(committed)) {
		t.Errorf("posthorn_relay_published_total = %v, want %d", n, len(committed))
	}
}

// buildInversion commits revision r of account A with a LARGER transaction
// ID than revision r+1: T2 takes its ID on account B first, T1 locks A and
// commits r, then T2 (blocked on A until then) commits r+1.
func buildInversion(t *testing.T, pool *pgxpool.Pool, a, b string) {
	t.Helper()
	ctx := context.Background()
	relaytest.MustPost(t, pool, b) // B exists
	t2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Rollback(ctx)
	var t2pid int
	if err := t2.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&t2pid); err != nil {
		t.Fatal(err)
	}
	if _, err := relaytest.Post(ctx, t2, b); err != nil { // T2 takes its xid here
		t.Fatal(err)
	}
	t1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(ctx)
	r1, err := relaytest.Post(ctx, t1, a) // T1: lock A, insert revision r, larger xid
	if err != nil {
		t.Fatal(err)
	}
	t2done := make(chan error, 1)
	go func() {
		_, err := relaytest.Post(ctx, t2, a) // waits for T1's lock on A
		if err == nil {
			err = t2.Commit(ctx)
		}
		t2done <- err
	}()
	wait.For(t, 10*time.Second, "T2 to wait for A's lock", func() bool {
		var waiting bool
		_ = pool.QueryRow(ctx, `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, t2pid).Scan(&waiting)
		return waiting
	})
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-t2done; err != nil {
		t.Fatal(err)
	}
	var x1, x2 string
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT xid::text FROM outbox WHERE aggregate_id = $1 AND revision = 1),
		(SELECT xid::text FROM outbox WHERE aggregate_id = $1 AND revision = 2)`, a).Scan(&x1, &x2); err != nil {
		t.Fatal(err)
	}
	if r1[0].Revision != 1 || !(len(x2) < len(x1) || (len(x2) == len(x1) && x2 < x1)) {
		t.Fatalf("setup: want revision 2's xid (%s) below revision 1's (%s)", x2, x1)
	}
}

func TestTransactionIDInversionKeepsRevisionOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		unsafeXID  bool
		wantFirstR int64
	}{
		{"id order (the relay)", false, 1},
		// Negative control: the same rows read in transaction-ID order come
		// out inverted, so the test above would catch an xid-ordered relay.
		{"negative control: xid order", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, memory.Config{})
			buildInversion(t, f.pool, "acc-A", "acc-B")
			f.start("relay", nil, &polling.Hooks{UnsafeOrderByXID: tc.unsafeXID})
			got := f.waitDelivered(4)
			var revs []int64
			for _, e := range got {
				if e.AggregateID == "acc-A" {
					revs = append(revs, e.Revision)
				}
			}
			if len(revs) != 2 || revs[0] != tc.wantFirstR {
				t.Fatalf("acc-A revisions delivered %v, want revision %d first", revs, tc.wantFirstR)
			}
		})
	}
}

// lateCommit holds a transaction open with a row inserted, whose id is
// smaller than those of the 30 rows it then commits on other accounts, and
// waits until the relay delivered those 30; the caller commits late.
func (f *fixture) lateCommit(ctx context.Context) (late pgx.Tx, lateRow, others []relaytest.Posted) {
	f.t.Helper()
	late, err := f.pool.Begin(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = late.Rollback(ctx) })
	lateRow, err = relaytest.Post(ctx, late, "acc-late")
	if err != nil {
		f.t.Fatal(err)
	}
	for i := range 30 {
		others = append(others, relaytest.MustPost(f.t, f.pool, fmt.Sprintf("acc-%d", i))...)
	}
	f.waitDelivered(len(others))
	return late, lateRow, others
}

func TestLateCommitIsRelayedNotSkipped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	ctx := context.Background()
	r := f.start("relay", nil)
	late, lateRow, others := f.lateCommit(ctx)
	wait.For(t, 10*time.Second, "later rows marked", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
	wait.For(t, 10*time.Second, "held-by-open-transaction gauge", func() bool {
		return promtest.Value(t, r.reg, "posthorn_relay_held_by_open_transaction_seconds") > 0
	})
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := f.waitDelivered(len(others) + 1)
	if last := got[len(got)-1]; last.EventID != lateRow[0].EventID {
		t.Fatalf("last delivered %s, want the late row %s", last.EventID, lateRow[0].EventID)
	}
	wait.For(t, 10*time.Second, "gauge back to 0", func() bool {
		return promtest.Value(t, r.reg, "posthorn_relay_held_by_open_transaction_seconds") == 0
	})
}

// Negative control of TestLateCommitIsRelayedNotSkipped: a relay that reads
// "id > the last id it saw" steps over the late row for good, while a row
// committed after it still arrives.
func TestLateCommitNegativeControlCursorSkipsIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	ctx := context.Background()
	f.start("relay", nil, &polling.Hooks{UnsafeCursor: true})
	late, lateRow, others := f.lateCommit(ctx)
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := relaytest.MustPost(t, f.pool, "acc-after")
	got := f.waitDelivered(len(others) + 1)
	if last := got[len(got)-1]; last.EventID != after[0].EventID {
		t.Fatalf("last delivered %s, want the row committed after the late one", last.EventID)
	}
	for _, e := range got {
		if e.EventID == lateRow[0].EventID {
			t.Fatal("the cursor relay delivered the late row: this control no longer shows the skip")
		}
	}
}

var errCrash = errors.New("crash")

func TestCrashAfterAckBeforeMarkerResends(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	posted := relaytest.MustPostN(t, f.pool, 20, 4)
	crashing := f.start("relay", nil, &polling.Hooks{AfterAck: func([]core.Envelope) error { return errCrash }})
	<-crashing.Stopped()
	if n := len(f.sink.Records(core.TopicEvents)); n != len(posted) {
		t.Fatalf("before the crash the sink ACKed %d records, want %d", n, len(posted))
	}
	if n := relaytest.Unrelayed(t, f.pool); n != len(posted) {
		t.Fatalf("after a crash before the marker, %d rows unrelayed, want all %d", n, len(posted))
	}
	// Restart (same owner, as a restarted process): everything is sent again
	// with the same event IDs, then marked.
	f.start("relay", nil)
	got := f.waitDelivered(2 * len(posted))
	wait.For(t, 10*time.Second, "markers", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
	count := map[string]int{}
	for _, e := range got {
		count[e.EventID]++
	}
	for _, p := range posted {
		if count[p.EventID] != 2 {
			t.Fatalf("event %s sent %d times, want 2 (once before the crash, once after)", p.EventID, count[p.EventID])
		}
	}
	relaytest.CheckOrder(t, got, true)
}

func leaseOwners(t *testing.T, store *relaystore.Store) map[string]int {
	t.Helper()
	st, err := store.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, s := range st.Shards {
		if s.ExpiresAt != nil && s.ExpiresAt.After(time.Now()) {
			out[s.Owner]++
		}
	}
	return out
}

func TestTwoRelaysShareShardsAndTakeOverAStalledOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	var stallA atomic.Bool
	release := make(chan struct{})
	stalled := make(chan struct{}, 1)
	a := f.start("relay-a", func(c *relay.Settings) { c.LeaseTTL = time.Second }, &polling.Hooks{BeforePublish: func([]core.Envelope) {
		if stallA.Load() {
			select {
			case stalled <- struct{}{}:
			default:
			}
			<-release
		}
	}})
	b := f.start("relay-b", func(c *relay.Settings) { c.LeaseTTL = time.Second })
	wait.For(t, 10*time.Second, "an even split of the 16 shards", func() bool {
		o := leaseOwners(t, f.store)
		return o["relay-a"] == 8 && o["relay-b"] == 8
	})
	posted := relaytest.MustPostN(t, f.pool, 200, 40)
	f.waitDelivered(len(posted))
	wait.For(t, 10*time.Second, "markers", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })

	// Stall A inside its loop, with a batch read: B must take its shards over
	// once A's leases expire, and deliver everything.
	stallA.Store(true)
	posted = append(posted, relaytest.MustPostN(t, f.pool, 200, 40)...)
	<-stalled
	wait.For(t, 15*time.Second, "B to take all 16 shards", func() bool { return leaseOwners(t, f.store)["relay-b"] == 16 })
	got := f.waitDelivered(len(posted))
	wait.For(t, 10*time.Second, "markers", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
	if n := promtest.Value(t, b.reg, "posthorn_relay_lease_takeovers_total"); n < 1 {
		t.Errorf("lease takeovers = %v, want at least 1", n)
	}
	// A wakes up with a stale batch: it must abandon it, not publish it.
	before := len(f.sink.Records(core.TopicEvents))
	stallA.Store(false)
	close(release)
	wait.For(t, 10*time.Second, "A to abandon its stale batch", func() bool {
		return promtest.Value(t, a.reg, "posthorn_relay_abandoned_batches_total") >= 1
	})
	if after := len(f.sink.Records(core.TopicEvents)); after != before {
		t.Errorf("the stalled relay published %d records after losing its leases", after-before)
	}
	ids := map[string]bool{}
	for _, e := range got {
		ids[e.EventID] = true
	}
	for _, p := range posted {
		if !ids[p.EventID] {
			t.Fatalf("event %s not delivered", p.EventID)
		}
	}
	relaytest.CheckOrder(t, f.delivered(), true)
}

func TestStaleOwnersMarkerIsFenced(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	var once sync.Once
	inMarker := make(chan struct{})
	release := make(chan struct{})
	a := f.start("relay-a", func(c *relay.Settings) { c.LeaseTTL = time.Second }, &polling.Hooks{BeforeMarker: func() {
		once.Do(func() { close(inMarker); <-release })
	}})
	wait.For(t, 10*time.Second, "A to hold all shards", func() bool { return leaseOwners(t, f.store)["relay-a"] == 16 })
	posted := relaytest.MustPost(t, f.pool, "acc-1", "acc-2", "acc-3")
	<-inMarker // A has the ACK and is about to write its marker; it stalls here
	f.start("relay-b", func(c *relay.Settings) { c.LeaseTTL = time.Second })
	wait.For(t, 15*time.Second, "B to take the shards over", func() bool { return leaseOwners(t, f.store)["relay-b"] == 16 })
	close(release)
	wait.For(t, 10*time.Second, "A's markers refused", func() bool {
		return promtest.Value(t, a.reg, "posthorn_relay_fenced_markers_total") == float64(len(posted))
	})
	wait.For(t, 10*time.Second, "B's markers", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
}

func TestParkedAccountDoesNotStopOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{MaxPayloadBytes: 1024})
	ctx := context.Background()
	// acc-bad's first record is too large for the sink; its second is fine
	// but must wait behind the first.
	relaytest.MustPostPayload(t, f.pool, "acc-bad", make([]byte, 4096))
	relaytest.MustPost(t, f.pool, "acc-bad")
	good := relaytest.MustPostN(t, f.pool, 50, 10)
	r := f.start("relay", nil)
	got := f.waitDelivered(len(good))
	wait.For(t, 10*time.Second, "parked gauge", func() bool {
		return promtest.Value(t, r.reg, "posthorn_relay_parked_aggregates") == 1
	})
	for _, e := range got {
		if e.AggregateID == "acc-bad" {
			t.Fatalf("a record of the parked account was delivered: r%d", e.Revision)
		}
	}
	st, err := f.store.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Parked) != 1 || st.Parked[0].AggregateID != "acc-bad" || st.Backlog != 2 {
		t.Fatalf("status: parked %+v, backlog %d; want acc-bad parked and its 2 rows waiting", st.Parked, st.Backlog)
	}
	// More postings keep flowing while acc-bad stays parked.
	more := relaytest.MustPost(t, f.pool, "acc-new")
	wait.For(t, 10*time.Second, "a new account's event", func() bool {
		for _, e := range f.delivered() {
			if e.EventID == more[0].EventID {
				return true
			}
		}
		return false
	})
	// Release: the relay tries again, the record is still too large, the
	// account is parked again (the operator must fix the cause first).
	if err := f.store.Release(ctx, core.AggregateAccount, "acc-bad"); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Release(ctx, core.AggregateAccount, "acc-bad"); !errors.Is(err, core.ErrNotParked) {
		t.Fatalf("second release: %v, want ErrNotParked", err)
	}
	wait.For(t, 10*time.Second, "parked again", func() bool {
		p, _ := f.store.Parked(ctx)
		return len(p) == 1
	})
}

func TestSinkOutageRetriesAndRecovers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	r := f.start("relay", nil)
	first := relaytest.MustPost(t, f.pool, "acc-1", "acc-2")
	f.waitDelivered(len(first))
	f.sink.SetDown(true)
	posted := relaytest.MustPostN(t, f.pool, 30, 5)
	wait.For(t, 10*time.Second, "retries", func() bool { return promtest.Value(t, r.reg, "posthorn_relay_retries_total") >= 3 })
	if n := relaytest.Unrelayed(t, f.pool); n != len(posted) {
		t.Fatalf("during the outage %d rows unrelayed, want %d", n, len(posted))
	}
	f.sink.SetDown(false)
	got := f.waitDelivered(len(first) + len(posted))
	wait.For(t, 10*time.Second, "markers", func() bool { return relaytest.Unrelayed(t, f.pool) == 0 })
	relaytest.CheckOrder(t, got, false)
}

func TestStopReleasesLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memory.Config{})
	r := f.start("relay", nil)
	wait.For(t, 10*time.Second, "all shards", func() bool { return leaseOwners(t, f.store)["relay"] == 16 })
	relaytest.MustPost(t, f.pool, "acc-1")
	f.waitDelivered(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if o := leaseOwners(t, f.store); len(o) != 0 {
		t.Fatalf("after Stop, leases still held: %v", o)
	}
	if err := r.Ready(); err == nil {
		t.Errorf("Ready after Stop = nil")
	}
}

func TestConfigValidation(t *testing.T) {
	_, pool := pgtest.Ledger(t)
	_, err := polling.New(relaystore.New(pool), memory.New(memory.Config{}), relay.Settings{BatchSize: -1})
	if !errors.Is(err, relay.ErrInvalidConfig) {
		t.Fatalf("BatchSize -1: %v, want ErrInvalidConfig", err)
	}
}
