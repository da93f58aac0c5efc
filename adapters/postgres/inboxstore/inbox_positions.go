package inboxstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/core"
)

// ErrNotNewConsumer: a baseline was asked for a consumer that has already
// received events; its state would be overwritten.
var ErrNotNewConsumer = errors.New("the consumer has already received events")

// SetPositions starts a new ordered consumer at a cut: in tx, the consumer
// database's transaction that also writes the consumer's snapshot of the
// same cut, each aggregate's last applied revision becomes its revision at
// the cut. The inbox then counts every later delivery of a revision at or
// below it as a duplicate and applies only later revisions. It refuses a
// consumer with inbox rows or positions already (ErrNotNewConsumer):
// positions move only forward by applying events.
func (in *Inbox) SetPositions(ctx context.Context, tx pgx.Tx, consumer string, positions map[core.AggregateKey]int64) error {
	var used bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM consumer_inbox WHERE consumer = $1)
		OR EXISTS (SELECT 1 FROM consumer_positions WHERE consumer = $1)`, consumer).Scan(&used); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if used {
		return fmt.Errorf("baseline of %s: %w", consumer, ErrNotNewConsumer)
	}
	types, ids, revs := make([]string, 0, len(positions)), make([]string, 0, len(positions)), make([]int64, 0, len(positions))
	for a, rev := range positions {
		if rev < 0 {
			return fmt.Errorf("baseline of %s: %s %s: revision %d is negative", consumer, a.Type, a.ID, rev)
		}
		types, ids, revs = append(types, a.Type), append(ids, a.ID), append(revs, rev)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id, last_revision)
		SELECT $1, t, i, r FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(t, i, r)`, consumer, types, ids, revs); err != nil {
		return fmt.Errorf("baseline of %s: positions: %w", consumer, err)
	}
	return nil
}
