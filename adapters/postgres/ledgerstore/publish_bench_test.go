package ledgerstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
)

// BenchmarkPublishFunction measures what the hardened publishing functions
// cost a service's write path: posthorn_publish and posthorn_send_command
// calls per second, side by side in one run, in
//
//	version8   the previous release's functions (definer in public,
//	           search_path public, pg_temp, the caller's prefix), called by
//	           the tables' owner as that release's services did
//	hardened   this release's (invoker wrappers over posthorn.write,
//	           owned by posthorn_definer, the configured prefix read from
//	           posthorn.settings), called by a posthorn_publisher login
//
// Each transaction makes POSTHORN_BENCH_CALLS calls (default 50; half
// events, half commands, each on its own aggregate), so the functions'
// own work is not hidden behind one commit's flush per call. The modes
// alternate in chunks of transactions, POSTHORN_BENCH_CHUNKS times
// (default 10), rotating which goes first, so both see the same drift of a
// shared machine. The workload is fixed and b.N ignored (make bench runs
// -benchtime 1x).
func BenchmarkPublishFunction(b *testing.B) {
	calls := pgtest.EnvInt(b, "POSTHORN_BENCH_CALLS", 50)
	chunks := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNKS", 10)
	const txPerChunk = 20
	oldURL := pgtest.LedgerAt(b, 8)
	newURL, _ := roletest.Ledger(b)
	modes := []*publishMode{
		{name: "version8", pool: pgtest.SmallPool(b, oldURL, 1)},
		{name: "hardened", pool: roletest.As(b, newURL, postgres.RolePublisher)},
	}
	for _, m := range modes {
		m.run(b, "warm", txPerChunk, calls) // plans cached, aggregates' pages in memory
		m.elapsed, m.calls = 0, 0
	}
	b.ResetTimer()
	for c := range chunks {
		for i := range modes {
			m := modes[(c+i)%len(modes)]
			m.run(b, "c"+strconv.Itoa(c), txPerChunk, calls)
		}
	}
	b.StopTimer()
	for _, m := range modes {
		b.ReportMetric(float64(m.calls)/m.elapsed.Seconds(), m.name+"_calls/s")
	}
	b.ReportMetric(modes[1].elapsed.Seconds()/float64(modes[1].calls)/(modes[0].elapsed.Seconds()/float64(modes[0].calls)), "hardened/version8_time")
}

type publishMode struct {
	name    string
	pool    *pgxpool.Pool
	elapsed time.Duration
	calls   int
}

func (m *publishMode) run(b *testing.B, tag string, txs, calls int) {
	ctx := context.Background()
	start := time.Now()
	for t := range txs {
		err := pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
			for i := range calls {
				id := fmt.Sprintf("w-%s-%d-%d", tag, t, i)
				q := `SELECT * FROM posthorn_publish('wallet', $1, 'wallet.credited', '{"amount":"12.50"}')`
				if i%2 == 1 {
					q = `SELECT * FROM posthorn_send_command('wallet', $1, 'payouts.payout.execute', '{"amount":"12.50"}')`
				}
				if _, err := tx.Exec(ctx, q, id); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatalf("%s: %v", m.name, err)
		}
	}
	m.elapsed += time.Since(start)
	m.calls += txs * calls
}

// BenchmarkPublishUnderASnapshot measures posthorn_publish while a
// REPEATABLE READ snapshot is held open for the whole run: 4 writers
// publishing one event per transaction, all of one hot aggregate (each of
// its own with POSTHORN_BENCH_SPREAD=1), which collects tens of thousands
// of events behind the snapshot; its row lock serialises them, so what a
// publish spends under it is the aggregate's rate. Side by side in one
// run:
//
//	version17  the migrations up to 00017: the publish bumps its
//	           aggregate's row, a version the snapshot keeps per event
//	floor      this release's: the publish locks the row, reads the newest
//	           revision from the outbox's unique index
//
// The modes alternate in chunks of POSTHORN_BENCH_EVENTS events (default
// 4,000), POSTHORN_BENCH_CHUNKS times (default 8); it prints each mode's
// rate per chunk, so a cost that grows with the aggregate's history shows
// as a falling rate.
func BenchmarkPublishUnderASnapshot(b *testing.B) {
	perChunk := pgtest.EnvInt(b, "POSTHORN_BENCH_EVENTS", 4000)
	chunks := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNKS", 8)
	spread := pgtest.EnvInt(b, "POSTHORN_BENCH_SPREAD", 0) == 1
	const writers = 4
	ctx := context.Background()
	oldURL := pgtest.LedgerAt(b, 17)
	newURL, _ := pgtest.Ledger(b)
	type snapMode struct {
		name  string
		pool  *pgxpool.Pool
		rates []float64
		total time.Duration
	}
	modes := []*snapMode{
		{name: "version17", pool: pgtest.SmallPool(b, oldURL, writers+1)},
		{name: "floor", pool: pgtest.SmallPool(b, newURL, writers+1)},
	}
	for _, m := range modes {
		holdSnapshot(b, m.pool)
	}
	b.ResetTimer()
	for c := range chunks {
		for i := range modes {
			m := modes[(c+i)%len(modes)]
			start := time.Now()
			errs := make([]error, writers)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for range perChunk / writers {
						id := "w-hot"
						if spread {
							id = "w-" + strconv.Itoa(w)
						}
						if _, err := m.pool.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', $1, 'wallet.credited', '{"amount":"12.50"}')`, id); err != nil {
							errs[w] = err
							return
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatalf("%s: %v", m.name, err)
			}
			d := time.Since(start)
			m.total += d
			m.rates = append(m.rates, float64(perChunk/writers*writers)/d.Seconds())
		}
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
	for _, m := range modes {
		first, last := m.rates[0], m.rates[len(m.rates)-1]
		b.ReportMetric(first, m.name+"_first_ev/s")
		b.ReportMetric(last, m.name+"_last_ev/s")
		line := ""
		for _, r := range m.rates {
			line += fmt.Sprintf(" %.0f", r)
		}
		fmt.Printf("BenchmarkPublishUnderASnapshot: %-9s events/s per chunk of %d:%s (last/first %.2f)\n", m.name, perChunk, line, last/first)
	}
	b.ReportMetric(modes[1].rates[len(modes[1].rates)-1]/modes[0].rates[len(modes[0].rates)-1], "floor/version17_last")
}
