package opsstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/ops"
)

// RecordCoverage advances the consumer's verified boundary (never lowers
// it) with a new witness, and returns the boundary now recorded.
func (s *Store) RecordCoverage(ctx context.Context, consumer string, cut, coveredID int64) (ops.Coverage, error) {
	c := ops.Coverage{Consumer: consumer}
	err := s.pool.QueryRow(ctx, `
INSERT INTO ops_coverage AS c (consumer, cut_sequence, covered_outbox_id, witness) VALUES ($1, $2, $3, gen_random_uuid())
ON CONFLICT (consumer) DO UPDATE
   SET cut_sequence = greatest(c.cut_sequence, EXCLUDED.cut_sequence),
       covered_outbox_id = greatest(c.covered_outbox_id, EXCLUDED.covered_outbox_id),
       verified_at = now(), witness = EXCLUDED.witness
RETURNING cut_sequence, covered_outbox_id, verified_at, witness::text`, consumer, cut, coveredID).
		Scan(&c.CutSequence, &c.CoveredOutboxID, &c.VerifiedAt, &c.Witness)
	if err != nil {
		return c, fmt.Errorf("record coverage of %s: %w", consumer, err)
	}
	return c, nil
}

// Coverages returns every consumer's verified boundary, by name.
func (s *Store) Coverages(ctx context.Context) (map[string]ops.Coverage, error) {
	list, err := pgrows.Query(ctx, s.pool, pgx.RowToStructByPos[ops.Coverage], `SELECT consumer, cut_sequence, covered_outbox_id, verified_at, coalesce(witness::text, '') FROM ops_coverage`)
	if err != nil {
		return nil, fmt.Errorf("coverage: %w", err)
	}
	return pgrows.ByKey(list, func(c ops.Coverage) string { return c.Consumer }), nil
}

// LedgerHistory names the ledger server's history now, as its system
// identifier and timeline: a consumer's reconciliation mark is used only
// by a pass proven against the history it was recorded under.
func (s *Store) LedgerHistory(ctx context.Context) (string, error) {
	h, err := postgres.ReadHistory(ctx, s.pool)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("system %d timeline %d", h.SystemIdentifier, h.Timeline), nil
}
