package inboxstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
)

// BenchmarkInboxRowSecurity measures what the consumers' row-level
// security costs the inbox: balance-projection's batches (50 events, the
// consumers' batch, each on its own account at its next revision, with
// the projection's effect) per second, side by side in one run, as
//
//	owner      the tables' owner, to whom no policy applies (what every
//	           consumer ran as before consumers had roles of their own)
//	own-role   a login in balance-projection's role, every inbox,
//	           position and retention row checked against the policies
//
// The modes alternate in chunks of POSTHORN_BENCH_BATCHES batches
// (default 20), POSTHORN_BENCH_CHUNKS times (default 10), rotating which
// goes first; each writes accounts of its own. The workload is fixed and
// b.N ignored (make bench runs -benchtime 1x).
func BenchmarkInboxRowSecurity(b *testing.B) {
	batches := pgtest.EnvInt(b, "POSTHORN_BENCH_BATCHES", 20)
	chunks := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNKS", 10)
	const perBatch = 50
	ctx := context.Background()
	url, owner := roletest.Consumer(b)
	modes := []struct {
		name  string
		pool  *pgxpool.Pool
		spent time.Duration
		rev   int64
	}{
		{name: "owner", pool: owner},
		{name: "own-role", pool: roletest.Pool(b, roletest.Consumers(b, url, "", "balance-projection"))},
	}
	for c := 0; c < chunks; c++ {
		for k := range modes {
			m := &modes[(c+k)%len(modes)]
			in := inboxstore.New(m.pool)
			start := time.Now()
			for i := 0; i < batches; i++ {
				m.rev++
				es := make([]core.Envelope, perBatch)
				for j := range es {
					es[j] = inboxEvent(fmt.Sprintf("%s-%d", m.name, j), m.rev)
				}
				out, err := in.ReceiveBatch(ctx, "balance-projection", true, es, projectionEffect, nil)
				if err != nil {
					b.Fatalf("%s: %v", m.name, err)
				}
				for _, o := range out.Outcomes {
					if o.Disposition != core.DispositionApplied {
						b.Fatalf("%s: %+v, want applied", m.name, o)
					}
				}
			}
			m.spent += time.Since(start)
		}
	}
	events := float64(chunks * batches * perBatch)
	rate := func(i int) float64 { return events / modes[i].spent.Seconds() }
	fmt.Printf("inbox row security: owner %.0f events/s, own role (policies) %.0f events/s: %.2fx (%d batches of %d each)\n",
		rate(0), rate(1), rate(1)/rate(0), chunks*batches, perBatch)
	b.ReportMetric(rate(0), "owner-events/s")
	b.ReportMetric(rate(1), "own-role-events/s")
}
