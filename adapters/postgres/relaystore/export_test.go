package relaystore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// The relay's read, its settings and its marker, for the plan tests.
var (
	ReadByIDForTest     = readByID
	ReadSettingsForTest = readSettings
	MarkRelayedForTest  = markRelayed
)

// NewWalkingFromStart is the store before the low-water mark: every read
// scans each shard's queue from its first entry, dead ones included (the
// negative control of the long-snapshot test and the benchmark's
// baseline).
func NewWalkingFromStart(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// newUnsafe is a store whose read marks and count marks both break the
// rule set breaks.
func newUnsafe(pool *pgxpool.Pool, set func(*unsafeLowWater)) *Store {
	s := New(pool)
	set(&s.low.unsafe)
	set(&s.counted.unsafe)
	return s
}

// NewCountingFromReadMarks counts the backlog from the read's marks, which
// pass parked aggregates' rows: the control of the parked-count test.
func NewCountingFromReadMarks(pool *pgxpool.Pool) *Store {
	s := New(pool)
	s.counted = s.low
	return s
}

// NewTrustingEveryRead raises each shard's mark after every read, without
// waiting for the transactions that took ids to end: the control of the
// late-commit test.
func NewTrustingEveryRead(pool *pgxpool.Pool) *Store {
	return newUnsafe(pool, func(u *unsafeLowWater) { u.trustEveryRead = true })
}

// NewIgnoringReleases keeps the marks when a park is deleted: the control
// of the release test.
func NewIgnoringReleases(pool *pgxpool.Pool) *Store {
	return newUnsafe(pool, func(u *unsafeLowWater) { u.ignoreReleases = true })
}

// Marks returns the store's marks of shards.
func (s *Store) Marks(shards []int) []int64 {
	lows, _ := s.low.marks(shards)
	return lows
}

// CountMarks returns the marks Status counts shards' backlog from.
func (s *Store) CountMarks(shards []int) []int64 {
	lows, _ := s.counted.marks(shards)
	return lows
}

// ReadBuffers is what one read of shards from the store's marks costs the
// server: the buffers its plan touched (EXPLAIN ANALYZE BUFFERS).
func (s *Store) ReadBuffers(ctx context.Context, shards []int, perShard int) (int64, error) {
	lows, _ := s.low.marks(shards)
	return explainBuffers(ctx, s.pool, readByID, toInt32(shards), perShard, []int64{}, lows)
}

// explainBuffers runs q with args under the read's settings in a read-only
// transaction with EXPLAIN ANALYZE BUFFERS and returns the buffers its
// plan touched.
func explainBuffers(ctx context.Context, pool *pgxpool.Pool, q string, args ...any) (int64, error) {
	var plan []map[string]any
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, readSettings); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q, args...).Scan(&plan)
	})
	if err != nil || len(plan) == 0 {
		return 0, err
	}
	top, _ := plan[0]["Plan"].(map[string]any)
	hit, _ := top["Shared Hit Blocks"].(float64)
	read, _ := top["Shared Read Blocks"].(float64)
	return int64(hit + read), nil
}

// StatusBuffers is what Status's count of the backlog from the store's
// count marks costs the server: the buffers its plan touched.
func (s *Store) StatusBuffers(ctx context.Context) (int64, error) {
	return s.countBuffers(ctx, countFromMarks)
}

// countProbingEachRow is countFromMarks as it was, taking the oldest age
// over every pending row, each looked up in the outbox: the control of
// the count's cost.
const countProbingEachRow = `
SELECT l.shard, coalesce(l.owner, ''), CASE WHEN l.owner IS NULL THEN NULL ELSE l.expires_at END,
       b.n, extract(epoch FROM now() - b.oldest)::float8, b.first
FROM relay_leases l
LEFT JOIN unnest($1::int[], $2::bigint[]) AS s(shard, low) ON s.shard = l.shard
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(o.created_at) AS oldest, min(p.id) AS first
    FROM outbox_pending p
    CROSS JOIN LATERAL (SELECT created_at FROM outbox o WHERE o.id = p.id OFFSET 0) o
    WHERE p.shard = l.shard AND p.id >= coalesce(s.low, 0)) b
ORDER BY l.shard`

// StatusBuffersProbingEachRow is StatusBuffers for the control's count.
func (s *Store) StatusBuffersProbingEachRow(ctx context.Context) (int64, error) {
	return s.countBuffers(ctx, countProbingEachRow)
}

func (s *Store) countBuffers(ctx context.Context, q string) (int64, error) {
	shards := make([]int, core.Shards)
	for i := range shards {
		shards[i] = i
	}
	lows, _ := s.counted.marks(shards)
	return explainBuffers(ctx, s.pool, q, toInt32(shards), lows)
}

// NewWaitingForEveryTransaction completes a tick only once the oldest
// running transaction of the server has passed it: the control of the
// test with an unrelated open transaction.
func NewWaitingForEveryTransaction(pool *pgxpool.Pool) *Store {
	return newUnsafe(pool, func(u *unsafeLowWater) { u.ignoreWriters = true })
}

// NewUsingSnapshotXmax takes a snapshot's xmax for the next transaction ID
// of its ticks: the control of the concurrent-commit test.
func NewUsingSnapshotXmax(pool *pgxpool.Pool) *Store {
	return newUnsafe(pool, func(u *unsafeLowWater) { u.xmaxAsNext = true })
}

// NewIgnoringHistory keeps the marks and ticks across a failover: the
// control of the failover test.
func NewIgnoringHistory(pool *pgxpool.Pool) *Store {
	return newUnsafe(pool, func(u *unsafeLowWater) { u.ignoreHistory = true })
}

// AuditingEveryRead makes s audit its marks after every read; an hour
// apart, the audit is off for the length of a test.
func (s *Store) AuditingEveryRead(on bool) *Store {
	s.audit.every, s.audit.last = 0, time.Time{}
	if !on {
		s.audit.every, s.audit.last = time.Hour, time.Now()
	}
	return s
}
