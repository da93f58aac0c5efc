package ledgerstore

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/posthorn/posthorn/adapters/postgres"
)

// wakePace is the shortest interval between two wake-up NOTIFYs.
const wakePace = 2 * time.Millisecond

// RelayWaker tells listening relays, after commit and outside the writing
// transaction, that new outbox rows exist (NOTIFY on NotifyChannel).
//
// A NOTIFY inside the posting transaction would take PostgreSQL's
// database-wide notify lock at every commit and hold it through the
// commit's WAL flush, serialising the writers (measured: two thirds of the
// ledger's throughput with 8 writers). Here at most one notifier runs at a
// time, sending at most one NOTIFY per wakePace, and each NOTIFY covers
// every Wake before it was sent.
//
// Invariant: every Wake is followed by a NOTIFY sent after it (pending is
// set before the notifier is looked for, and the notifier re-checks
// pending after it stops), so a relay is never left waiting for its
// fallback poll. A failed NOTIFY is nobody's error: the relay's poll still
// finds the rows. Safe for concurrent use.
type RelayWaker struct {
	pool    *pgxpool.Pool
	pending atomic.Bool
	running atomic.Bool
}

// NewRelayWaker returns a waker that notifies through pool.
func NewRelayWaker(pool *pgxpool.Pool) *RelayWaker { return &RelayWaker{pool: pool} }

// Wake is called after a commit that wrote outbox rows; it never blocks.
func (w *RelayWaker) Wake() {
	w.pending.Store(true)
	if !w.running.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			for w.pending.Swap(false) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = w.pool.Exec(ctx, "SELECT pg_notify($1, '')", postgres.NotifyChannel)
				cancel()
				// Under load one NOTIFY per wakePace covers many commits,
				// and a busy relay loops without waiting for any.
				time.Sleep(wakePace)
			}
			w.running.Store(false)
			if !w.pending.Load() || !w.running.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}
