package opsstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

// Retention measured on 1M rows. Loading the rows takes
// minutes, more than `make bench` has for every benchmark together, so
// these run only when asked:
//
//	POSTHORN_BENCH_1M=1 go test -run '^$' -bench 'Retention1M' -benchtime 1x -timeout 30m ./adapters/postgres/opsstore/
//
// Each iteration loads 1,000,000 rows (outside the timer) and prunes them
// in batches of 1000; rows/s and the mean time per batch (one statement,
// so the longest any lock is held is about that) are reported.

func benchPrune(b *testing.B, pool *pgxpool.Pool, load []string, prune func() (ops.PruneResult, error), want int64) {
	b.Helper()
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		for _, q := range load {
			if _, err := pool.Exec(ctx, q); err != nil {
				b.Fatalf("%s: %v", q, err)
			}
		}
		b.StartTimer()
		start := time.Now()
		res, err := prune()
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if res.Deleted != want {
			b.Fatalf("deleted %d, want %d", res.Deleted, want)
		}
		b.ReportMetric(float64(res.Deleted)/took.Seconds(), "rows/s")
		b.ReportMetric(float64(took.Milliseconds())/float64(res.Batches), "ms/batch")
		b.ReportMetric(float64(res.Batches), "batches")
	}
}

// An ordered consumer: 10,000 accounts x 100 revisions, positions at 100;
// everything but the last applied revision of each account goes.
func BenchmarkRetention1MInboxOrdered(b *testing.B) {
	benchInboxPrune(b, `now() - interval '48 hours'`, []string{
		`INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id, last_revision)
		 SELECT 'bench', 'account', 'acc-' || a, 100 FROM generate_series(0, 9999) a`,
	}, ops.InboxHorizon{Ordered: time.Now().Add(-time.Hour), Unordered: time.Now().Add(-time.Hour)}, 1_000_000-10_000)
}

// An unordered consumer: 1M rows past the replay window plus the margin.
func BenchmarkRetention1MInboxUnordered(b *testing.B) {
	benchInboxPrune(b, `now() - interval '10 days' + g * interval '1 millisecond'`, nil,
		ops.InboxHorizon{Ordered: time.Now().Add(-time.Hour), Unordered: time.Now().Add(-8 * 24 * time.Hour)}, 1_000_000)
}

// benchInboxPrune loads 1M applied inbox rows of consumer "bench" (10,000
// accounts x 100 revisions, row g received and updated at the SQL
// expression receivedAt of g), then the statements of extra, and prunes
// them behind h, expecting want rows deleted.
func benchInboxPrune(b *testing.B, receivedAt string, extra []string, h ops.InboxHorizon, want int64) {
	b.Helper()
	pgtest.Require1M(b, "loads 1,000,000 rows (minutes)")
	_, pool := pgtest.Consumer(b)
	in := inboxstore.New(pool)
	load := append([]string{
		`TRUNCATE consumer_inbox, consumer_positions, consumer_retention`,
		`INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition, received_at, updated_at)
		 SELECT 'bench', gen_random_uuid()::text, 'event', 'ledger.account.posted', 'account', 'acc-' || (g % 10000), g / 10000 + 1, 'applied',
		        ` + receivedAt + `, ` + receivedAt + `
		 FROM generate_series(0, 999999) g`,
	}, extra...)
	load = append(load, `VACUUM ANALYZE consumer_inbox`)
	benchPrune(b, pool, load, func() (ops.PruneResult, error) {
		return in.PruneInbox(context.Background(), "bench", h, 1000)
	}, want)
}

// 1M idempotency keys older than the TTL.
func BenchmarkRetention1MIdempotencyKeys(b *testing.B) {
	pgtest.Require1M(b, "loads 1,000,000 rows (minutes)")
	_, pool := pgtest.Ledger(b)
	store := opsstore.New(pool)
	load := []string{
		`TRUNCATE idempotency_keys`,
		`INSERT INTO journals (id, sequence, posted_at)
		 SELECT gen_random_uuid(), g, now() FROM generate_series(1, 1000000) g ON CONFLICT DO NOTHING`,
		`INSERT INTO idempotency_keys (key, request_hash, journal_id, response, created_at)
		 SELECT 'key-' || j.sequence, '\x00', j.id, '{}', now() - interval '40 days' FROM journals j`,
		`VACUUM ANALYZE idempotency_keys`,
	}
	benchPrune(b, pool, load, func() (ops.PruneResult, error) {
		return store.PruneIdempotencyKeys(context.Background(), time.Now().Add(-30*24*time.Hour), 1000)
	}, 1_000_000)
}
