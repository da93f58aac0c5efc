package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/tracing"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// BenchmarkTracingWritePath measures the write path (the Posting API's
// handler, in process, into ledgerstore.Store.Post on Postgres) with tracing off,
// as deployed by default, and on (every request sampled, spans through the
// batch processor to an exporter that drops them: the SDK's cost, not a
// collector's), side by side in one run, with 8 concurrent writers.
//
// Each mode has its own fresh ledger, warmed up (all 200 accounts created,
// statements prepared). The timed part alternates the modes in chunks of
// POSTHORN_BENCH_TRACE_CHUNK postings (default 150), POSTHORN_BENCH_TRACE_CHUNKS
// times (default 8), rotating which goes first, so both see the same drift
// of a shared machine. A mode's rate is its postings over its summed time.
// The workload is fixed and b.N ignored: `-benchtime 1x` (make bench) gives
// the figures in a few seconds.
//
// With tracing off the write path runs none of the tracing code except two
// context lookups (is there a span?); what "off costs the same as before"
// means is measured against the previous commit in docs/measured.md.
func BenchmarkTracingWritePath(b *testing.B) {
	chunk := envInt("POSTHORN_BENCH_TRACE_CHUNK", 150)
	chunks := envInt("POSTHORN_BENCH_TRACE_CHUNKS", 8)
	const writers, accounts = 8, 200
	tp, err := tracing.NewProvider(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter()), tracing.Config{SampleRatio: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	modes := []*traceBenchMode{{name: "off"}, {name: "on", tp: tp}}
	for _, m := range modes {
		m.setup(b, writers, accounts)
	}
	b.ResetTimer()
	for c := 0; c < chunks; c++ {
		for i := range modes {
			m := modes[(c+i)%len(modes)]
			m.elapsed += m.run(b, fmt.Sprintf("bench-%d-", c), chunk, writers, accounts)
		}
	}
	b.StopTimer()
	off := float64(chunk*chunks) / modes[0].elapsed.Seconds()
	on := float64(chunk*chunks) / modes[1].elapsed.Seconds()
	b.ReportMetric(0, "ns/op") // the workload is fixed; ns/op means nothing here
	b.ReportMetric(off, "off_tx/s")
	b.ReportMetric(on, "on_tx/s")
	b.ReportMetric(on/off, "on/off")
	b.Logf("write path through the API, %d postings per mode, %d writers: tracing off %.0f tx/s, on %.0f tx/s, on/off %.3f",
		chunk*chunks, writers, off, on, on/off)
}

type traceBenchMode struct {
	name    string
	tp      trace.TracerProvider
	handler http.Handler
	elapsed time.Duration
}

func (m *traceBenchMode) setup(b *testing.B, writers, accounts int) {
	b.Helper()
	_, pool := pgtest.Ledger(b)
	srv, err := api.New(api.Config{Logger: slog.New(slog.DiscardHandler), TracerProvider: m.tp},
		ledgerstore.New(pool, ledgerstore.Config{}))
	if err != nil {
		b.Fatal(err)
	}
	m.handler = srv.Handler()
	m.run(b, "warm-", accounts, writers, accounts)
}

// run posts n transfers between the accounts with writers goroutines
// and returns the wall time. Posting i moves money from account i to i+1
// (mod accounts), so the warm-up creates every account.
func (m *traceBenchMode) run(b *testing.B, keyPrefix string, n, writers, accounts int) time.Duration {
	var claimed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range writers {
		wg.Go(func() {
			for {
				i := int(claimed.Add(1) - 1)
				if i >= n {
					return
				}
				body := fmt.Sprintf(`{"entries":[{"account":"acc-%d","direction":"debit","amount":"%d","currency":"EUR"},`+
					`{"account":"acc-%d","direction":"credit","amount":"%[2]d","currency":"EUR"}]}`, i%accounts, 1+i%97, (i+1)%accounts)
				req := httptest.NewRequest(http.MethodPost, "/v1/postings", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", keyPrefix+strconv.Itoa(i))
				rec := httptest.NewRecorder()
				m.handler.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Errorf("%s: posting answered %d: %s", m.name, rec.Code, rec.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if b.Failed() {
		b.FailNow()
	}
	return elapsed
}
