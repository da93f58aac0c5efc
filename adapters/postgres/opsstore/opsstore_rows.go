package opsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres/internal/outboxrow"
	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/ops"
)

// storedColumns are readColumns plus what an operator's read adds: the
// journal's sequence, the row's creation time and whether it is relayed.
const storedColumns = outboxrow.Columns + `, coalesce(j.sequence, 0), o.created_at, ` + Relayed

// rowFilterWhere is the filter of ReadRows and CountRows. The journal is
// joined laterally (one index lookup per outbox row) so that the keyset
// read "id > after ORDER BY id LIMIT n" stays an index range scan whatever
// the planner believes about the tables' sizes (a generic plan over stale
// statistics otherwise hash-joins the whole outbox for every batch).
const rowFilterWhere = `o.id > $1 AND o.id <= $2
  AND ($3 = 0 OR j.sequence >= $3) AND ($4 = 0 OR j.sequence <= $4)
  AND ($5::timestamptz IS NULL OR o.occurred_at >= $5) AND ($6::timestamptz IS NULL OR o.occurred_at < $6)
  AND ($7 = '' OR (o.aggregate_type = 'account' AND o.aggregate_id = $7))
  AND (NOT $8 OR o.kind = 'event') AND (NOT $9 OR ` + Relayed + `)
  AND ($10::text[] IS NULL OR o.event_id = ANY($10::text[]::uuid[]))`

// CountRows counts the rows matching f.
func (s *Store) CountRows(ctx context.Context, f ops.RowFilter) (int64, error) {
	args := rowFilterArgs(f)
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox o LEFT JOIN LATERAL (SELECT sequence FROM journals WHERE id = o.journal_id) j ON true WHERE `+rowFilterWhere, args...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count outbox rows: %w", err)
	}
	return n, nil
}

// rowFilterArgs are f as the parameters $1..$10 of rowFilterWhere.
func rowFilterArgs(f ops.RowFilter) []any {
	through := f.ThroughID
	if through <= 0 {
		through = 1<<63 - 1
	}
	var eventIDs []string
	if f.EventIDs != nil {
		eventIDs = make([]string, 0, len(f.EventIDs))
		for _, id := range f.EventIDs {
			if u, err := uuid.Parse(id); err == nil {
				eventIDs = append(eventIDs, u.String()) // others cannot match any row
			}
		}
	}
	var from, to *time.Time
	if !f.From.IsZero() {
		from = &f.From
	}
	if !f.To.IsZero() {
		to = &f.To
	}
	return []any{f.AfterID, through, f.SequenceFrom, f.SequenceTo, from, to, f.Account, f.EventsOnly, f.RelayedOnly, eventIDs}
}

// ReadRows returns up to limit rows matching f, in id order.
func (s *Store) ReadRows(ctx context.Context, f ops.RowFilter, limit int) ([]ops.StoredRow, error) {
	args := append(rowFilterArgs(f), limit)
	rows, err := s.pool.Query(ctx, `
SELECT `+storedColumns+`
FROM outbox o LEFT JOIN LATERAL (SELECT sequence FROM journals WHERE id = o.journal_id) j ON true
WHERE `+rowFilterWhere+`
ORDER BY o.id LIMIT $11`, args...)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows: %w", err)
	}
	defer rows.Close()
	var out []ops.StoredRow
	for rows.Next() {
		var (
			scan outboxrow.Scan
			r    ops.StoredRow
		)
		if err := rows.Scan(append(scan.Dest(), &r.JournalSequence, &r.CreatedAt, &r.Relayed)...); err != nil {
			return nil, fmt.Errorf("read outbox rows: %w", err)
		}
		row, err := scan.Decode()
		if err != nil {
			return nil, err
		}
		r.ID, r.Shard, r.Envelope = row.ID, row.Shard, row.Envelope
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read outbox rows: %w", err)
	}
	return out, nil
}

// MarkResent writes the marker of rows ids that a resend got ACKed and that
// are still unrelayed (deletes their pending rows). It is not fenced: the
// resend holds no lease. A relay sending the same rows concurrently only
// repeats them, which the inbox absorbs.
func (s *Store) MarkResent(ctx context.Context, ids []int64) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM outbox_pending p USING outbox o
WHERE o.id = ANY($1) AND p.shard = o.shard AND p.id = o.id`, ids)
	if err != nil {
		return 0, fmt.Errorf("write resend markers: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// FirstUnrelayedBefore returns, for the aggregate, the first unrelayed row
// with id < beforeID, if any.
func (s *Store) FirstUnrelayedBefore(ctx context.Context, aggregateType, aggregateID string, beforeID int64) (*ops.UnrelayedPredecessor, error) {
	var p ops.UnrelayedPredecessor
	err := s.pool.QueryRow(ctx, `
SELECT o.id, o.event_id::text, o.revision FROM outbox o
WHERE o.aggregate_type = $1 AND o.aggregate_id = $2 AND o.id < $3 AND NOT `+Relayed+`
ORDER BY o.id LIMIT 1`, aggregateType, aggregateID, beforeID).Scan(&p.ID, &p.EventID, &p.Revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("unrelayed predecessor: %w", err)
	}
	return &p, nil
}

// UncertainRow is an unrelayed row that a relay may have published without
// writing the marker.
type UncertainRow struct {
	ID          int64     `json:"id"`
	EventID     string    `json:"event_id"`
	Shard       int       `json:"shard"`
	Account     string    `json:"account"`
	Revision    int64     `json:"revision"`
	LeaseOwner  string    `json:"lease_owner"`
	LeaseExpiry time.Time `json:"lease_expired_at"`
	CreatedAt   time.Time `json:"created_at"`
}

// Uncertain lists the uncertain rows: unrelayed rows of a shard whose lease
// expired while still owned (its relay died or stalled without releasing
// it; a clean stop releases the lease and clears the owner) that were
// created before the lease expired, so the relay that held it may have
// read and published them and lost the ACK or the marker. Their outcome is
// unknown until they are sent again (by the next relay that takes the
// shard, or `posthorn outbox resend`). It returns up to limit rows in id
// order and how many there are.
func (s *Store) Uncertain(ctx context.Context, limit int) ([]UncertainRow, int64, error) {
	var total int64
	if err := s.pool.QueryRow(ctx, `
SELECT count(*) FROM outbox_pending p JOIN outbox o ON o.id = p.id JOIN relay_leases l ON l.shard = p.shard
WHERE l.owner IS NOT NULL AND l.expires_at < now() AND o.created_at < l.expires_at`).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("uncertain rows: %w", err)
	}
	out, err := pgrows.Query(ctx, s.pool, pgx.RowToStructByPos[UncertainRow], `
SELECT o.id, o.event_id::text, o.shard, o.aggregate_id, o.revision, l.owner, l.expires_at, o.created_at
FROM outbox_pending p JOIN outbox o ON o.id = p.id JOIN relay_leases l ON l.shard = p.shard
WHERE l.owner IS NOT NULL AND l.expires_at < now() AND o.created_at < l.expires_at
ORDER BY o.id LIMIT $1`, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("uncertain rows: %w", err)
	}
	if out == nil {
		out = []UncertainRow{}
	}
	return out, total, nil
}
