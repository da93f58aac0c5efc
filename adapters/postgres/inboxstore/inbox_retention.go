package inboxstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/ops"
)

// Retention: the consumer inbox (here) and the ledger's idempotency keys
// (opsstore.Store.PruneIdempotencyKeys) are pruned in small batches (each one
// short statement of its own, so no lock is held for long and a cancelled
// run leaves a consistent state), behind a horizon past which a repeat can
// no longer arrive or is still recognised without the row (see PruneInbox).

// PruneInbox deletes consumer's final inbox rows (applied, duplicate)
// behind h, oldest first, in batches of at most batch rows, each its own
// statement. Held, parked and rejected rows are never deleted. The horizon
// is recorded first (consumer_retention), so that reconciliation, which
// finds the pruned events without a disposition, can tell them from
// missing ones (Inbox.Pruned). A cancelled ctx stops between batches.
func (in *Inbox) PruneInbox(ctx context.Context, consumer string, h ops.InboxHorizon, batch int) (ops.PruneResult, error) {
	var res ops.PruneResult
	if batch < 1 {
		return res, errors.New("prune inbox: batch must be at least 1")
	}
	if h.Unordered.After(h.Ordered) {
		h.Unordered = h.Ordered // the ordered bound is the outer one of both
	}
	if err := in.recordHorizon(ctx, consumer, h); err != nil {
		return res, err
	}
	// Keyset over (updated_at, event_id) through consumer_inbox_final_age: a
	// row kept (the last applied revision of an aggregate) is passed once,
	// not read again by every later batch.
	var after inboxKey
	for {
		n, last, err := in.pruneBatch(ctx, consumer, h, after, batch)
		if err != nil {
			return res, err
		}
		if last == nil {
			break // nothing left behind the horizon
		}
		after = *last
		res.Batches++
		res.Deleted += n
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// recordHorizon records h for consumer (consumer_retention); it never
// moves back.
func (in *Inbox) recordHorizon(ctx context.Context, consumer string, h ops.InboxHorizon) error {
	if _, err := in.pool.Exec(ctx, `
INSERT INTO consumer_retention AS r (consumer, ordered_before, unordered_before) VALUES ($1, $2, $3)
ON CONFLICT (consumer) DO UPDATE
   SET ordered_before = greatest(r.ordered_before, EXCLUDED.ordered_before),
       unordered_before = greatest(r.unordered_before, EXCLUDED.unordered_before), updated_at = now()`,
		consumer, h.Ordered, h.Unordered); err != nil {
		return fmt.Errorf("prune inbox: record horizon: %w", err)
	}
	return nil
}

// inboxKey is a position in consumer_inbox_final_age.
type inboxKey struct {
	updatedAt time.Time
	eventID   string
}

// pruneBatch scans up to batch final rows after the key and deletes those
// behind h, in one statement; it returns how many it deleted and the last
// key scanned (nil: none was). The delete finds its rows by the ctid the
// scan read in the same statement (a TID scan, not a second primary-key
// probe per row), rechecking the key and disposition. The same statement
// counts them in consumer_retention and raises pruned_xid to the newest
// changed_xid deleted, so no delete is ever left unrecorded: the failover
// check reads a consumer from its mark only while pruned_xid lies below it.
func (in *Inbox) pruneBatch(ctx context.Context, consumer string, h ops.InboxHorizon, after inboxKey, batch int) (int64, *inboxKey, error) {
	var n int64
	var lastAt *time.Time
	var lastID *string
	err := in.pool.QueryRow(ctx, `
WITH scan AS (
    SELECT i.ctid AS tid, i.event_id, i.updated_at,
           CASE WHEN p.last_revision IS NOT NULL THEN i.revision > 0 AND i.revision < p.last_revision
                ELSE i.updated_at < $3 END AS prunable
    FROM consumer_inbox i
    LEFT JOIN consumer_positions p
           ON p.consumer = i.consumer AND p.aggregate_type = i.aggregate_type AND p.aggregate_id = i.aggregate_id
    WHERE i.consumer = $1 AND i.disposition IN ('applied', 'duplicate') AND i.updated_at < $2
      AND (i.updated_at, i.event_id) > ($4, $5)
    ORDER BY i.updated_at, i.event_id
    LIMIT $6),
d AS (
    DELETE FROM consumer_inbox x USING scan s
    WHERE s.prunable AND x.ctid = s.tid AND x.consumer = $1 AND x.event_id = s.event_id
      AND x.disposition IN ('applied', 'duplicate')
    RETURNING x.changed_xid),
counted AS (
    UPDATE consumer_retention r
    SET deleted_rows = r.deleted_rows + (SELECT count(*) FROM d), updated_at = now(),
        pruned_xid = greatest(r.pruned_xid, (SELECT changed_xid FROM d ORDER BY changed_xid DESC NULLS LAST LIMIT 1))
    WHERE r.consumer = $1 AND EXISTS (SELECT FROM d))
SELECT (SELECT count(*) FROM d),
       (SELECT updated_at FROM scan ORDER BY updated_at DESC, event_id DESC LIMIT 1),
       (SELECT event_id FROM scan ORDER BY updated_at DESC, event_id DESC LIMIT 1)`,
		consumer, h.Ordered, h.Unordered, after.updatedAt, after.eventID, batch).Scan(&n, &lastAt, &lastID)
	if err != nil {
		return 0, nil, fmt.Errorf("prune inbox of %s: %w", consumer, err)
	}
	if lastAt == nil {
		return n, nil, nil
	}
	return n, &inboxKey{updatedAt: *lastAt, eventID: *lastID}, nil
}

// Pruned returns which of cands PruneInbox may have removed for consumer:
// by the rule it deletes with, read against the recorded horizon. Nothing
// is pruned for a consumer retention never ran for. The caller decides
// whether that proves anything (reconciliation accepts it only for events
// an earlier run already proved).
func (in *Inbox) Pruned(ctx context.Context, consumer string, cands []ops.PrunedCandidate) (map[string]bool, error) {
	out := map[string]bool{}
	if len(cands) == 0 {
		return out, nil
	}
	var ordered, unordered time.Time
	err := in.pool.QueryRow(ctx, `SELECT ordered_before, unordered_before FROM consumer_retention WHERE consumer = $1`, consumer).
		Scan(&ordered, &unordered)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: pruned: %w", err)
	}
	ids, types, aggs, revs, created := make([]string, len(cands)), make([]string, len(cands)), make([]string, len(cands)),
		make([]int64, len(cands)), make([]time.Time, len(cands))
	for i, c := range cands {
		ids[i], types[i], aggs[i], revs[i], created[i] = c.EventID, c.AggregateType, c.AggregateID, c.Revision, c.CreatedAt
	}
	got, err := pgrows.Query(ctx, in.pool, pgx.RowTo[string], `
SELECT c.event_id FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[]) AS c(event_id, aggregate_type, aggregate_id, revision, created_at)
LEFT JOIN consumer_positions p ON p.consumer = $1 AND p.aggregate_type = c.aggregate_type AND p.aggregate_id = c.aggregate_id
WHERE CASE WHEN p.last_revision IS NOT NULL THEN c.revision > 0 AND c.revision < p.last_revision AND c.created_at < $7
           ELSE c.created_at < $8 END`,
		consumer, ids, types, aggs, revs, created, ordered, unordered)
	if err != nil {
		return nil, fmt.Errorf("inbox: pruned: %w", err)
	}
	for _, id := range got {
		out[id] = true
	}
	return out, nil
}
