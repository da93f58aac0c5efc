package relaystore

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The relay's read and its settings, for the plan test.
var (
	ReadByIDForTest     = readByID
	ReadSettingsForTest = readSettings
)

// NewWalkingFromStart is the store before the low-water mark: every read
// scans each shard's queue from its first entry, dead ones included (the
// negative control of the long-snapshot test and the benchmark's
// baseline).
func NewWalkingFromStart(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// NewTrustingEveryRead raises each shard's mark after every read, without
// waiting for the transactions that took ids to end: the control of the
// late-commit test.
func NewTrustingEveryRead(pool *pgxpool.Pool) *Store {
	s := New(pool)
	s.low.unsafe.trustEveryRead = true
	return s
}

// NewIgnoringReleases keeps the marks when a park is deleted: the control
// of the release test.
func NewIgnoringReleases(pool *pgxpool.Pool) *Store {
	s := New(pool)
	s.low.unsafe.ignoreReleases = true
	return s
}

// Marks returns the store's marks of shards.
func (s *Store) Marks(shards []int) []int64 {
	lows, _ := s.low.marks(shards)
	return lows
}

// ReadBuffers is what one read of shards from the store's marks costs the
// server: the buffers its plan touched (EXPLAIN ANALYZE BUFFERS).
func (s *Store) ReadBuffers(ctx context.Context, shards []int, perShard int) (int64, error) {
	var plan []map[string]any
	lows, _ := s.low.marks(shards)
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, readSettings); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+readByID,
			toInt32(shards), perShard, []int64{}, lows).Scan(&plan)
	})
	if err != nil || len(plan) == 0 {
		return 0, err
	}
	top, _ := plan[0]["Plan"].(map[string]any)
	hit, _ := top["Shared Hit Blocks"].(float64)
	read, _ := top["Shared Read Blocks"].(float64)
	return int64(hit + read), nil
}

// NewWaitingForEveryTransaction completes a tick only once the oldest
// running transaction of the server has passed it: the control of the
// test with an unrelated open transaction.
func NewWaitingForEveryTransaction(pool *pgxpool.Pool) *Store {
	s := New(pool)
	s.low.unsafe.ignoreWriters = true
	return s
}

// NewUsingSnapshotXmax takes a snapshot's xmax for the next transaction ID
// of its ticks: the control of the concurrent-commit test.
func NewUsingSnapshotXmax(pool *pgxpool.Pool) *Store {
	s := New(pool)
	s.low.unsafe.xmaxAsNext = true
	return s
}

// NewIgnoringHistory keeps the marks and ticks across a failover: the
// control of the failover test.
func NewIgnoringHistory(pool *pgxpool.Pool) *Store {
	s := New(pool)
	s.low.unsafe.ignoreHistory = true
	return s
}
