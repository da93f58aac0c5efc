package opsstore

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/ops"
)

// Store is the operators' view of the ledger database: cuts for
// reconciliation, verified coverage, archive segments, the cleanup floor,
// replay progress, resend and uncertain rows (migration 00003_ops). Each
// method is one short statement or transaction, except a Cut, which is one
// read-only REPEATABLE READ transaction held until Close. Its files are
// named after what they serve: opsstore_cut (reconciliation),
// opsstore_coverage, opsstore_rows (archive, replay, resend, uncertain
// rows), opsstore_archive, opsstore_cleanup (and the idempotency keys'
// retention), opsstore_replay.
type Store struct {
	pool *pgxpool.Pool
}

var _ ops.Store = (*Store)(nil)

// New returns the store over the ledger pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Relayed is an SQL condition on the outbox row aliased o: true once a sink
// has ACKed the row and its marker was written, that is, its entry in the
// relay's work queue outbox_pending is gone (see migration 00005).
const Relayed = `NOT EXISTS (SELECT 1 FROM outbox_pending p WHERE p.shard = o.shard AND p.id = o.id)`
