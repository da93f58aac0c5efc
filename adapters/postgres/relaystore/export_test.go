package relaystore

import "github.com/jackc/pgx/v5/pgxpool"

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
func (s *Store) Marks(shards []int) []int64 { return s.low.marks(shards) }
