package relay

import (
	"context"
	"errors"
	"time"

	"github.com/posthorn/posthorn/core"
)

// ErrAlreadyStarted is returned by a relay's second Start.
var ErrAlreadyStarted = errors.New("relay already started")

// ErrRowsBelowMarks is wrapped by the error of a read (Outbox's
// ReadBatchSkipping) after an audit of the read's low-water marks found
// committed rows of unparked aggregates below them: a rule of the read
// broke. The marks are dropped by then, so the next read sends those rows;
// both modes count it in posthorn_relay_rows_below_marks_total.
var ErrRowsBelowMarks = errors.New("committed rows lie below the relay's low-water marks")

// Outbox is what both modes read from and write to the ledger's outbox
// besides their own markers and leases: the unrelayed rows in order (the
// polling relay's read, the CDC relay's catch-up), parking, and the
// figures of the backlog gauges. Every method is one short statement and
// safe for concurrent use; adapters/postgres/relaystore.Store implements
// it.
type Outbox interface {
	// ReadBatchSkipping returns up to perShard unrelayed rows of each shard
	// in shards, in order, skipping parked aggregates and the rows in skip
	// (a published batch whose marker is still being written); an error
	// wrapping ErrRowsBelowMarks says that earlier reads missed rows.
	ReadBatchSkipping(ctx context.Context, shards []int, perShard int, skip []int64, order core.ReadOrder) ([]core.OutboxRow, error)
	// Park records an aggregate as parked (the first reason is kept) and
	// reports whether it was newly parked.
	Park(ctx context.Context, p core.ParkedAggregate) (bool, error)
	// Status reads the backlog, the leases and the parked aggregates.
	Status(ctx context.Context) (core.OutboxStatus, error)
	// OldestOpenTransactionAge is the age of the oldest open writing
	// transaction other than the relays' own (zero if none).
	OldestOpenTransactionAge(ctx context.Context) (time.Duration, error)
}
