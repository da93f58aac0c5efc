package opsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/posthorn/posthorn/ops"
)

// Cleaned returns the cleanup state (zero before the first cleanup).
func (s *Store) Cleaned(ctx context.Context) (ops.CleanupState, error) {
	var c ops.CleanupState
	err := s.pool.QueryRow(ctx, `SELECT deleted_through_id, journal_floor, deleted_rows, updated_at FROM ops_cleanup`).
		Scan(&c.DeletedThroughID, &c.JournalFloor, &c.DeletedRows, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return ops.CleanupState{}, nil
	}
	if err != nil {
		return c, fmt.Errorf("cleanup state: %w", err)
	}
	return c, nil
}

// PlanCleanup computes the journal floor for rows up to through (the
// highest sequence whose journals have no outbox row above through, capped
// by maxSequence, the lowest cut of the required consumers' coverage) and
// counts the eligible rows.
func (s *Store) PlanCleanup(ctx context.Context, through, maxSequence int64, window time.Duration) (ops.CleanupPlan, error) {
	p := ops.CleanupPlan{ThroughID: through}
	var next pgtype.Int8
	if err := s.pool.QueryRow(ctx, `
SELECT min(j.sequence) FROM outbox o JOIN journals j ON j.id = o.journal_id WHERE o.id > $1`, through).Scan(&next); err != nil {
		return p, fmt.Errorf("plan cleanup: %w", err)
	}
	p.JournalFloor = maxSequence
	if next.Valid && next.Int64-1 < p.JournalFloor {
		p.JournalFloor = next.Int64 - 1
	}
	var first, last pgtype.Int8
	err := s.pool.QueryRow(ctx, `
SELECT now() - $2::interval,
       count(*) FILTER (WHERE o.created_at < now() - $2::interval),
       min(o.id) FILTER (WHERE o.created_at < now() - $2::interval),
       max(o.id) FILTER (WHERE o.created_at < now() - $2::interval),
       count(*) FILTER (WHERE o.created_at >= now() - $2::interval)
FROM outbox o LEFT JOIN journals j ON j.id = o.journal_id
WHERE o.id <= $1 AND `+Relayed+` AND (o.journal_id IS NULL OR j.sequence <= $3)`,
		through, window, p.JournalFloor).Scan(&p.Cutoff, &p.Rows, &first, &last, &p.InsideWindow)
	if err != nil {
		return p, fmt.Errorf("plan cleanup: %w", err)
	}
	p.FirstID, p.LastID = first.Int64, last.Int64
	return p, nil
}

// DeleteBatch deletes up to limit eligible rows of plan with id > after,
// lowest ids first, in one short transaction, and returns how many and the
// highest id deleted. Eligibility is re-checked by the statement itself.
func (s *Store) DeleteBatch(ctx context.Context, plan ops.CleanupPlan, after int64, limit int) (int64, int64, error) {
	var n int64
	var last pgtype.Int8
	err := s.pool.QueryRow(ctx, `
WITH d AS (
    DELETE FROM outbox WHERE id IN (
        SELECT o.id FROM outbox o LEFT JOIN journals j ON j.id = o.journal_id
        WHERE o.id > $1 AND o.id <= $2 AND `+Relayed+` AND o.created_at < $3
          AND (o.journal_id IS NULL OR j.sequence <= $4)
        ORDER BY o.id LIMIT $5)
    RETURNING id)
SELECT count(*), max(id) FROM d`, after, plan.ThroughID, plan.Cutoff, plan.JournalFloor, limit).Scan(&n, &last)
	if err != nil {
		return 0, 0, fmt.Errorf("delete outbox batch: %w", err)
	}
	return n, last.Int64, nil
}

// RecordCleanup advances the cleanup state after deleted rows were removed
// up to through with the plan's floor.
func (s *Store) RecordCleanup(ctx context.Context, through, floor, deleted int64) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO ops_cleanup AS c (deleted_through_id, journal_floor, deleted_rows) VALUES ($1, $2, $3)
ON CONFLICT (singleton) DO UPDATE
   SET deleted_through_id = greatest(c.deleted_through_id, EXCLUDED.deleted_through_id),
       journal_floor = greatest(c.journal_floor, EXCLUDED.journal_floor),
       deleted_rows = c.deleted_rows + EXCLUDED.deleted_rows, updated_at = now()`, through, floor, deleted)
	if err != nil {
		return fmt.Errorf("record cleanup: %w", err)
	}
	return nil
}

// PruneIdempotencyKeys deletes the Posting API's idempotency keys created
// before before, oldest first, in batches of at most batch keys, each its
// own statement (through idempotency_keys_created_at). A request that
// repeats an expired key is then a new posting. A cancelled ctx stops
// between batches.
//
// It goes through posthorn.prune_idempotency_keys, the only delete the
// component roles may run on the keys, which also keeps every key younger
// than the lifetime in posthorn.settings (WriteSettings): a before later
// than that prunes no more than the lifetime allows.
func (s *Store) PruneIdempotencyKeys(ctx context.Context, before time.Time, batch int) (ops.PruneResult, error) {
	var res ops.PruneResult
	if batch < 1 {
		return res, errors.New("prune idempotency keys: batch must be at least 1")
	}
	for {
		var n int64
		err := s.pool.QueryRow(ctx, `SELECT posthorn.prune_idempotency_keys($1, $2)`, before, batch).Scan(&n)
		if err != nil {
			return res, fmt.Errorf("prune idempotency keys: %w", err)
		}
		if n == 0 {
			return res, nil
		}
		res.Deleted += n
		res.Batches++
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
}
