package opsstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/ops"
)

// LoadReplay returns the saved progress of name (found false if none).
func (s *Store) LoadReplay(ctx context.Context, name string) (ops.ReplayProgress, bool, error) {
	p := ops.ReplayProgress{Name: name}
	err := s.pool.QueryRow(ctx, `SELECT spec, last_id, sent, done FROM ops_replay_progress WHERE name = $1`, name).
		Scan(&p.Spec, &p.LastID, &p.Sent, &p.Done)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("replay progress %s: %w", name, err)
	}
	return p, true, nil
}

// SaveReplay writes a named replay's progress.
func (s *Store) SaveReplay(ctx context.Context, p ops.ReplayProgress) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO ops_replay_progress (name, spec, last_id, sent, done) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, last_id = EXCLUDED.last_id, sent = EXCLUDED.sent,
       done = EXCLUDED.done, updated_at = now()`, p.Name, p.Spec, p.LastID, p.Sent, p.Done)
	if err != nil {
		return fmt.Errorf("save replay progress %s: %w", p.Name, err)
	}
	return nil
}
