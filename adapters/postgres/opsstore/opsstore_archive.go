package opsstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/ops"
)

// RecordSegment records a verified segment. It must start at the current
// archive coverage + 1; the check and the insert are one transaction
// under a lock, so two archivers cannot interleave.
func (s *Store) RecordSegment(ctx context.Context, seg ops.ArchiveSegment) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE ops_archive_segments IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("record segment: %w", err)
		}
		through, err := archiveThrough(ctx, tx)
		if err != nil {
			return fmt.Errorf("record segment: %w", err)
		}
		if seg.FirstID != through+1 {
			return fmt.Errorf("%w: segment %s starts at id %d, coverage ends at %d", ops.ErrArchiveGap, seg.Segment, seg.FirstID, through)
		}
		var first, last *string
		if seg.FirstEventID != "" {
			first, last = &seg.FirstEventID, &seg.LastEventID
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO ops_archive_segments (segment, first_id, last_id, rows, first_event_id, last_event_id, sha256)
VALUES ($1, $2, $3, $4, $5, $6, $7)`, seg.Segment, seg.FirstID, seg.LastID, seg.Rows, first, last, seg.SHA256); err != nil {
			return fmt.Errorf("record segment: %w", err)
		}
		return nil
	})
}

// ArchiveSegments lists the recorded segments in id order.
func (s *Store) ArchiveSegments(ctx context.Context) ([]ops.ArchiveSegment, error) {
	out, err := pgrows.Query(ctx, s.pool, pgx.RowToStructByPos[ops.ArchiveSegment], `
SELECT segment, first_id, last_id, rows, coalesce(first_event_id, ''), coalesce(last_event_id, ''), sha256, verified_at
FROM ops_archive_segments ORDER BY first_id`)
	if err != nil {
		return nil, fmt.Errorf("archive segments: %w", err)
	}
	return out, nil
}

// ArchiveThrough is the recorded archive coverage: every outbox row with
// id <= the result is in a verified segment (0: none).
func (s *Store) ArchiveThrough(ctx context.Context) (int64, error) {
	n, err := archiveThrough(ctx, s.pool)
	if err != nil {
		return 0, fmt.Errorf("archive coverage: %w", err)
	}
	return n, nil
}

// archiveThrough reads the archive coverage through q: the pool, or
// RecordSegment's transaction under its lock.
func archiveThrough(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT coalesce(max(last_id), 0) FROM ops_archive_segments`).Scan(&n)
	return n, err
}

// FirstUnrelayedID is the smallest id of an unrelayed row (0: none).
func (s *Store) FirstUnrelayedID(ctx context.Context) (int64, error) {
	var id pgtype.Int8
	err := s.pool.QueryRow(ctx, `SELECT min(id) FROM outbox_pending`).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("first unrelayed row: %w", err)
	}
	return id.Int64, nil
}
