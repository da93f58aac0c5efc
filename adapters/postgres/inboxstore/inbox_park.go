package inboxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// ParkExpiredHolds parks every aggregate of an ordered consumer whose
// oldest held event has waited longer than hold while its predecessor is
// still missing: the position is parked with a reason naming the missing
// revisions, and its held events become ParkedGap. They stay in the inbox
// with their payloads until Release.
func (in *Inbox) ParkExpiredHolds(ctx context.Context, consumer string, hold time.Duration) ([]consumers.Parked, error) {
	refs, err := pgrows.Query(ctx, in.pool, pgx.RowToStructByPos[core.AggregateKey], `
		SELECT i.aggregate_type, i.aggregate_id
		FROM consumer_inbox i
		JOIN consumer_positions p USING (consumer, aggregate_type, aggregate_id)
		WHERE i.consumer = $1 AND i.disposition = 'held' AND NOT p.parked
		GROUP BY i.aggregate_type, i.aggregate_id, p.last_revision
		HAVING min(i.held_since) <= now() - $2 * interval '1 microsecond'
		   AND min(i.revision) > p.last_revision + 1`,
		consumer, hold.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("inbox: expired holds: %w", err)
	}
	var parked []consumers.Parked
	for _, ref := range refs {
		p, ok, err := in.parkExpired(ctx, consumer, ref, hold)
		if err != nil {
			return parked, err
		}
		if ok {
			parked = append(parked, p)
		}
	}
	return parked, nil
}

func (in *Inbox) parkExpired(ctx context.Context, consumer string, ref core.AggregateKey, hold time.Duration) (consumers.Parked, bool, error) {
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return consumers.Parked{}, false, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	pos, err := lockInboxPosition(ctx, tx, consumer, ref.Type, ref.ID)
	if err != nil || pos.parked {
		return consumers.Parked{}, false, err
	}
	// Re-check under the lock: the predecessor may have been applied since.
	var (
		minRevP  *int64
		sinceP   *time.Time
		expiredP *bool
	)
	err = tx.QueryRow(ctx, `
		SELECT min(revision), min(held_since), min(held_since) <= now() - $4 * interval '1 microsecond'
		FROM consumer_inbox
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND disposition = 'held'`,
		consumer, ref.Type, ref.ID, hold.Microseconds()).Scan(&minRevP, &sinceP, &expiredP)
	if err != nil {
		return consumers.Parked{}, false, fmt.Errorf("inbox: expired holds: %w", err)
	}
	// No held rows any more (the aggregates of nothing are NULL), not yet
	// expired, or the predecessor arrived: nothing to park.
	if minRevP == nil || sinceP == nil || expiredP == nil || !*expiredP || *minRevP <= pos.last+1 {
		return consumers.Parked{}, false, nil
	}
	minRev, since := *minRevP, *sinceP
	missing := fmt.Sprintf("%d", pos.last+1)
	if minRev-1 > pos.last+1 {
		missing = fmt.Sprintf("%d..%d", pos.last+1, minRev-1)
	}
	reason := fmt.Sprintf("revision gap: last applied %d, missing %s, next held %d, held since %s",
		pos.last, missing, minRev, since.UTC().Format(time.RFC3339))
	if err := parkInboxAggregate(ctx, tx, consumer, ref.Type, ref.ID, reason); err != nil {
		return consumers.Parked{}, false, err
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM consumer_inbox
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND disposition = 'parked_gap'`,
		consumer, ref.Type, ref.ID).Scan(&n); err != nil {
		return consumers.Parked{}, false, err
	}
	if err := commitInbox(ctx, tx); err != nil {
		return consumers.Parked{}, false, err
	}
	return consumers.Parked{AggregateKey: ref, Reason: reason, Events: n, ParkedAt: time.Now()}, true, nil
}

// Runnable lists aggregates with held events that Drain would apply now:
// for an ordered consumer, unparked aggregates whose first held revision is
// next in line (or already applied); for an unordered one, any aggregate
// with held events (released poison).
func (in *Inbox) Runnable(ctx context.Context, consumer string, ordered bool) ([]core.AggregateKey, error) {
	q := `SELECT DISTINCT aggregate_type, aggregate_id FROM consumer_inbox
		WHERE consumer = $1 AND disposition = 'held'`
	if ordered {
		q = `SELECT i.aggregate_type, i.aggregate_id
		FROM consumer_inbox i
		JOIN consumer_positions p USING (consumer, aggregate_type, aggregate_id)
		WHERE i.consumer = $1 AND i.disposition = 'held' AND NOT p.parked
		GROUP BY i.aggregate_type, i.aggregate_id, p.last_revision
		HAVING min(i.revision) <= p.last_revision + 1`
	}
	refs, err := pgrows.Query(ctx, in.pool, pgx.RowToStructByPos[core.AggregateKey], q, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: runnable: %w", err)
	}
	return refs, nil
}

// Release lifts the park of one aggregate: its parked events go back to
// Held (the hold time starts again) so that Drain re-drives them in
// revision order once their predecessor is applied; if it is still
// missing they park again after the hold time. It returns how many events
// were released. The release is a database change only: a running
// consumer's sweeper (or Drain) applies them with the consumer's handler.
func (in *Inbox) Release(ctx context.Context, consumer, aggregateType, aggregateID string) (int, error) {
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `
		UPDATE consumer_positions
		   SET parked = false, parked_reason = NULL, parked_at = NULL, updated_at = now()
		 WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
		consumer, aggregateType, aggregateID); err != nil {
		return 0, fmt.Errorf("inbox: release: %w", err)
	}
	tag, err := tx.Exec(ctx, `
		UPDATE consumer_inbox
		   SET disposition = 'held', held_since = now(), updated_at = now(),
		       reason = 'released after: ' || coalesce(reason, disposition)
		 WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3
		   AND disposition IN ('parked_gap', 'parked_poison')`,
		consumer, aggregateType, aggregateID)
	if err != nil {
		return 0, fmt.Errorf("inbox: release: %w", err)
	}
	return int(tag.RowsAffected()), commitInbox(ctx, tx)
}
