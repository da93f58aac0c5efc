package relaytest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
	"github.com/posthorn/posthorn/relay/polling"
)

// StartMode starts a relay of mode (relay.ModePolling or relay.ModeCDC)
// on pool's outbox, publishing to sink with s, and returns a function that
// stops it softly (within 10 s): the way tests and benchmarks run either
// mode alike. A CDC relay
// (slot s.CDC.Slot) is returned once it streams, after its outbox
// catch-up, which may take a while on a backlog; its log goes to
// s.Logger too.
func StartMode(tb testing.TB, mode string, pool *pgxpool.Pool, sink core.Sink, s relay.Settings) (stop func()) {
	tb.Helper()
	ctx := context.Background()
	store := relaystore.New(pool)
	var r Relay
	var err error
	logs := &syncbuf.Buffer{}
	switch mode {
	case relay.ModePolling:
		r, err = polling.New(store, sink, s)
	case relay.ModeCDC:
		h := slog.Handler(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		if s.Logger != nil {
			h = slog.NewMultiHandler(h, s.Logger.Handler())
		}
		s.Logger = slog.New(h)
		r, err = cdc.New(store, cdcsource.New(pool), sink, s)
	default:
		tb.Fatalf("relaytest: mode %q, want polling or cdc", mode)
	}
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	stop = func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	}
	if mode == relay.ModeCDC {
		wait.For(tb, 5*time.Minute, "the CDC relay to stream", func() bool { return strings.Contains(logs.String(), "streaming the outbox") })
	}
	return stop
}

// Load is a paced load of transfers: postings of two events, each on one
// of two accounts, committed by a few writers at a steady rate, with each
// event's commit time, for the relay's commit-to-ACK latency.
type Load struct {
	mu        sync.Mutex
	committed map[string]time.Time
	postings  int
}

// RunLoad commits rate postings per second for period from writers
// goroutines on pool, over the accounts <prefix>-0 … <prefix>-(accounts-1),
// waking the relay after each commit as the ledger store does (the CDC
// relay ignores it). A deadlock victim is skipped, as a load generator
// moves on.
func RunLoad(ctx context.Context, pool *pgxpool.Pool, rate, writers int, period time.Duration, prefix string, accounts int) *Load {
	l := &Load{committed: map[string]time.Time{}}
	waker := ledgerstore.NewRelayWaker(pool)
	tokens := make(chan struct{}, rate)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-tokens:
				}
				n := g*131 + i*7
				a, b := fmt.Sprintf("%s-%d", prefix, n%accounts), fmt.Sprintf("%s-%d", prefix, (n+accounts/2)%accounts)
				ps, err := Commit(ctx, pool, a, b)
				now := time.Now()
				if err != nil {
					continue
				}
				waker.Wake()
				l.mu.Lock()
				l.postings++
				for _, p := range ps {
					l.committed[p.EventID] = now
				}
				l.mu.Unlock()
			}
		})
	}
	// Tokens are handed out every 10 ms; the writers take them as they can.
	tick := time.NewTicker(10 * time.Millisecond)
	end := time.Now().Add(period)
	for now := range tick.C {
		if now.After(end) {
			break
		}
		for range rate / 100 {
			select {
			case tokens <- struct{}{}:
			default:
			}
		}
	}
	tick.Stop()
	close(done)
	wg.Wait()
	return l
}

// Postings is how many postings the load committed.
func (l *Load) Postings() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.postings
}

// Latencies returns, sorted, how long after its commit each event of the
// load was first ACKed by sink; it fails tb unless every one was.
func (l *Load) Latencies(tb testing.TB, sink *AckTimes) []time.Duration {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	lat := make([]time.Duration, 0, len(l.committed))
	for id, t := range l.committed {
		if a, ok := sink.Acked(id); ok {
			lat = append(lat, max(a.Sub(t), 0))
		}
	}
	if len(lat) != len(l.committed) || len(lat) == 0 {
		tb.Fatalf("relaytest: %d of %d events ACKed", len(lat), len(l.committed))
	}
	slices.Sort(lat)
	return lat
}

// Percentiles returns the p50 and p99 of sorted durations.
func Percentiles(sorted []time.Duration) (p50, p99 time.Duration) {
	return sorted[len(sorted)/2], sorted[len(sorted)*99/100]
}
