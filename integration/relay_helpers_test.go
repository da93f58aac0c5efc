package integration

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// newRelay builds a polling relay with cfg on pool's outbox to sink, with
// hooks when given.
func newRelay(tb testing.TB, pool *pgxpool.Pool, sink core.Sink, cfg relay.Settings, hooks ...*polling.Hooks) *polling.Relay {
	tb.Helper()
	var h *polling.Hooks
	if len(hooks) > 0 {
		h = hooks[0]
	}
	r, err := polling.NewWithHooks(relaystore.New(pool), sink, cfg, h)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// startRelay is newRelay, started. The caller stops it: a benchmark as
// soon as its measurement ends, so that the relay does not run beside what
// it measures next.
func startRelay(tb testing.TB, pool *pgxpool.Pool, sink core.Sink, cfg relay.Settings, hooks ...*polling.Hooks) *polling.Relay {
	tb.Helper()
	r := newRelay(tb, pool, sink, cfg, hooks...)
	if err := r.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return r
}

// startTestRelay starts a polling relay on pool's outbox to sink with
// timings short enough for a test (polls of 50 ms, retries from 20 ms up
// to 300 ms, a 5 s lease) and stops it at cleanup. It returns the relay
// and the registry of its metrics. hooks, when given, are the relay's; a
// relay.FencedSink is used in exactly-once mode.
func startTestRelay(t *testing.T, pool *pgxpool.Pool, sink core.Sink, owner, sinkName string, hooks ...*polling.Hooks) (*polling.Relay, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := relay.Settings{
		Owner: owner, SinkName: sinkName, PollInterval: 50 * time.Millisecond, LeaseTTL: 5 * time.Second,
		RetryInitial: 20 * time.Millisecond, RetryMax: 300 * time.Millisecond, StatsInterval: 50 * time.Millisecond,
		Logger: relayQuietLog, Registerer: reg,
	}
	_, cfg.ExactlyOnce = sink.(relay.FencedSink)
	r := newRelay(t, pool, sink, cfg, hooks...)
	relaytest.Start(t, r)
	return r, reg
}

// headers are a Kafka record's headers, one value per key, as the sinks
// write them.
func headers(r *kgo.Record) map[string]string {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	return h
}

// livePostings commits postings, one after the other, on 23 accounts of
// their own (acc-<prefix>-<i>, two a posting) until the returned stop is
// called; stop returns how many events they wrote.
func livePostings(t *testing.T, pool *pgxpool.Pool, prefix string) (stop func() int) {
	t.Helper()
	var events atomic.Int64
	stopping, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stopping:
				return
			default:
			}
			p, err := relaytest.Commit(context.Background(), pool, fmt.Sprintf("acc-%s-%d", prefix, i%23), fmt.Sprintf("acc-%s-%d", prefix, (i+7)%23))
			if err != nil {
				t.Errorf("post: %v", err)
				return
			}
			events.Add(int64(len(p)))
		}
	}()
	return func() int {
		close(stopping)
		<-done
		return int(events.Load())
	}
}
