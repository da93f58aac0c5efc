package cdc_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
)

// shared is the throwaway wal_level=logical cluster most tests use (the
// shared server on 5432 runs wal_level=replica); tests that need their own
// server settings start their own.
var shared *pgcluster.Cluster

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	c, err := pgcluster.Start(ctx, pgcluster.Options{Logical: true})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdc tests need a throwaway PostgreSQL cluster:", err)
		os.Exit(1)
	}
	shared = c
	code := m.Run()
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func randName(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// fixture is one ledger database in a logical cluster, a memory sink, and
// CDC relays over them sharing one slot.
type fixture struct {
	t       *testing.T
	cluster *pgcluster.Cluster
	pool    *pgxpool.Pool
	store   *relaystore.Store
	source  *cdcsource.Source
	sink    *memory.Sink
	slot    string
	logs    *syncbuf.Buffer // the relays' logs, so tests can check what they say
}

func newFixture(t *testing.T, c *pgcluster.Cluster) *fixture {
	t.Helper()
	if c == nil {
		c = shared
	}
	pool, _ := pgtest.LedgerIn(t, c, 16)
	s := memory.New(memory.Config{})
	t.Cleanup(func() { _ = s.Close() })
	f := &fixture{t: t, cluster: c, pool: pool, store: relaystore.New(pool), source: cdcsource.New(pool), sink: s,
		slot: randName("slot_"), logs: &syncbuf.Buffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay logs:\n%s", f.logs)
		}
	})
	return f
}

type relayHandle struct {
	*cdc.Relay
	reg *prometheus.Registry
}

// start starts a CDC relay named owner on the fixture's slot, with the
// fixture's settings changed by mod (nil: none), and hooks (nil: none).
func (f *fixture) start(owner string, mod func(*relay.Settings), hooks ...*cdc.Hooks) relayHandle {
	f.t.Helper()
	reg := prometheus.NewRegistry()
	cfg := relay.Settings{
		Owner:         owner,
		SinkName:      "memory",
		CDC:           relay.CDC{Slot: f.slot, StatusInterval: 200 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond},
		BatchSize:     500,
		LeaseTTL:      2 * time.Second,
		RetryInitial:  10 * time.Millisecond,
		RetryMax:      100 * time.Millisecond,
		StatsInterval: 100 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Registerer:    reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	var h *cdc.Hooks
	if len(hooks) > 0 {
		h = hooks[0]
	}
	r, err := cdc.NewWithHooks(f.store, f.source, f.sink, cfg, h)
	if err != nil {
		f.t.Fatal(err)
	}
	relaytest.Start(f.t, r)
	return relayHandle{r, reg}
}

// waitStreaming waits until a relay logged that it streams (after its
// catch-up) n times in all.
func (f *fixture) waitStreaming(n ...int) {
	f.t.Helper()
	want := 1
	if len(n) > 0 {
		want = n[0]
	}
	wait.For(f.t, 30*time.Second, "the relay to stream", func() bool {
		return strings.Count(f.logs.String(), "streaming the outbox from the slot") >= want
	})
}

func (f *fixture) delivered() []core.Envelope { return relaytest.Delivered(f.t, f.sink) }

// waitAllDelivered waits until every posted event is in the sink and
// marked.
func (f *fixture) waitAllDelivered(posted []relaytest.Posted, d time.Duration) []core.Envelope {
	f.t.Helper()
	want := map[string]bool{}
	for _, p := range posted {
		want[p.EventID] = true
	}
	wait.For(f.t, d, fmt.Sprintf("%d events delivered and marked", len(posted)), func() bool {
		got := map[string]bool{}
		for _, e := range f.delivered() {
			got[e.EventID] = true
		}
		for id := range want {
			if !got[id] {
				return false
			}
		}
		return relaytest.Unrelayed(f.t, f.pool) == 0
	})
	return f.delivered()
}

// standbyTookOver lets w write at least n events and stops it, waits until
// every event it committed is delivered and marked, and checks that each
// account's events arrived in revision order (repeats allowed) and that
// standby took the slot's lease over. It returns what w posted and what
// the sink got.
func (f *fixture) standbyTookOver(w *writers, n int, standby relayHandle) ([]relaytest.Posted, []core.Envelope) {
	f.t.Helper()
	wait.For(f.t, 30*time.Second, fmt.Sprintf("%d events", n), func() bool { return w.count() >= n })
	posted := w.finish(f.t)
	got := f.waitAllDelivered(posted, 60*time.Second)
	relaytest.CheckOrder(f.t, got, true)
	if v := promtest.Value(f.t, standby.reg, "posthorn_relay_lease_takeovers_total"); v < 1 {
		f.t.Errorf("takeovers by %s = %v, want at least 1", standby.Owner(), v)
	}
	return posted, got
}

// missing returns the posted events that are not in the sink.
func (f *fixture) missing(posted []relaytest.Posted) []relaytest.Posted {
	got := map[string]bool{}
	for _, e := range f.delivered() {
		got[e.EventID] = true
	}
	var out []relaytest.Posted
	for _, p := range posted {
		if !got[p.EventID] {
			out = append(out, p)
		}
	}
	return out
}

// lostOnce waits until newest, committed after the rest of posted, is
// delivered, and returns the events of posted the sink still lacks then:
// what a negative control lost.
func (f *fixture) lostOnce(newest relaytest.Posted, what string, posted []relaytest.Posted) []relaytest.Posted {
	f.t.Helper()
	wait.For(f.t, 30*time.Second, what, func() bool {
		return len(f.missing([]relaytest.Posted{newest})) == 0
	})
	return f.missing(posted)
}

// repeats counts event IDs delivered more than once.
func repeats(got []core.Envelope) int {
	seen := map[string]int{}
	n := 0
	for _, e := range got {
		seen[e.EventID]++
		if seen[e.EventID] == 2 {
			n++
		}
	}
	return n
}

// writers posts transactions of two accounts each from n goroutines until
// stop is closed, and returns everything committed.
type writers struct {
	wg     sync.WaitGroup
	stop   chan struct{}
	mu     sync.Mutex
	posted []relaytest.Posted
	errs   chan error
}

func startWriters(t *testing.T, pool *pgxpool.Pool, n, accounts int, pause time.Duration) *writers {
	w := &writers{stop: make(chan struct{}), errs: make(chan error, n)}
	for g := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-w.stop:
					return
				default:
				}
				a := fmt.Sprintf("acc-%d", (g*7+i)%accounts)
				b := fmt.Sprintf("acc-%d", (g*13+i*3+1)%accounts)
				if a == b {
					b = fmt.Sprintf("acc-%d", (g*13+i*3+2)%accounts)
				}
				ps, err := relaytest.Commit(context.Background(), pool, a, b)
				if err != nil {
					if strings.Contains(err.Error(), "deadlock") {
						continue
					}
					w.errs <- err
					return
				}
				w.mu.Lock()
				w.posted = append(w.posted, ps...)
				w.mu.Unlock()
				if pause > 0 {
					time.Sleep(pause) // pacing the load, not synchronisation
				}
			}
		}()
	}
	return w
}

func (w *writers) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.posted)
}

func (w *writers) finish(t *testing.T) []relaytest.Posted {
	t.Helper()
	close(w.stop)
	w.wg.Wait()
	select {
	case err := <-w.errs:
		t.Fatalf("writer: %v", err)
	default:
	}
	return w.posted
}
