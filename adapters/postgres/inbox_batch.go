package postgres

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// ReceiveBatch records a run of deliveries in ONE transaction: one inbox
// row and at most one effect per event, one commit for all. Each event gets
// the disposition Receive would give it had the events been received one
// by one in (aggregate, revision) order — the order it applies them in, so
// a run of one aggregate's consecutive revisions is applied in a single
// transaction.
//
// It is all or nothing: on any error (a failing apply returns *consumers.ApplyError,
// a deadlock or a lost connection the database's error) the transaction is
// rolled back and nothing of the batch is recorded; the caller then
// receives the events one by one with Receive, which gives each failure its
// own handling (retry, poison). The position rows of every aggregate in the
// batch are locked in one statement, sorted, so batches of several
// instances serialise per aggregate without deadlocking each other.
//
// applyAll, when not nil, applies every event to be applied in one call
// (in that order) instead of apply once per event; an error from it is an
// *consumers.ApplyError naming the first of them.
func (in *Inbox) ReceiveBatch(ctx context.Context, consumer string, ordered bool, es []core.Envelope, apply consumers.Handler, applyAll consumers.BatchHandler) (consumers.BatchOutcome, error) {
	res := consumers.BatchOutcome{Outcomes: make([]consumers.Outcome, len(es))}
	order := make([]int, len(es))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		x, y := es[order[a]], es[order[b]]
		if x.AggregateType != y.AggregateType {
			return x.AggregateType < y.AggregateType
		}
		if x.AggregateID != y.AggregateID {
			return x.AggregateID < y.AggregateID
		}
		if x.Revision != y.Revision {
			return x.Revision < y.Revision
		}
		return x.EventID < y.EventID
	})
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()

	positions := map[consumers.Aggregate]*inboxPosition{}
	if ordered {
		var types, ids []string
		for _, i := range order {
			ref := consumers.Aggregate{Type: es[i].AggregateType, ID: es[i].AggregateID}
			if _, ok := positions[ref]; !ok {
				positions[ref] = nil
				types, ids = append(types, ref.Type), append(ids, ref.ID)
			}
		}
		if positions, err = lockInboxPositions(ctx, tx, consumer, types, ids); err != nil {
			return res, err
		}
	}

	// Insert every row first: the primary key decides which delivery owns
	// an event (as in Receive); the provisional disposition is replaced in
	// this transaction where needed.
	cols := inboxColumns{}
	for _, i := range order {
		cols.add(es[i])
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
		SELECT $1, u.event_id, u.kind, u.type, u.aggregate_type, u.aggregate_id, u.revision, 'applied'
		FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[])
		     AS u(event_id, kind, type, aggregate_type, aggregate_id, revision)
		ON CONFLICT (consumer, event_id) DO NOTHING
		RETURNING event_id`,
		consumer, cols.eventIDs, cols.kinds, cols.types, cols.aggTypes, cols.aggIDs, cols.revisions)
	if err != nil {
		return res, fmt.Errorf("inbox: insert: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return res, fmt.Errorf("inbox: insert: %w", err)
	}
	fresh := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		fresh[id] = true
	}

	var (
		advance inboxColumns
		toApply []core.Envelope
	)
	for _, i := range order {
		e := es[i]
		out := consumers.OutcomeOf(e)
		if !fresh[e.EventID] {
			// A repeat: the event ID had a row before this batch, or an
			// earlier delivery in this batch took it.
			if err := countInboxRepeat(ctx, tx, consumer, &out); err != nil {
				return res, err
			}
			res.Outcomes[i] = out
			continue
		}
		delete(fresh, e.EventID) // a second delivery in this batch is a repeat
		var pos *inboxPosition
		if ordered {
			pos = positions[consumers.Aggregate{Type: e.AggregateType, ID: e.AggregateID}]
			waits, err := notNextInLine(ctx, tx, consumer, e, *pos, &out)
			if err != nil {
				return res, err
			}
			if waits {
				res.Outcomes[i] = out
				continue
			}
		}
		if applyAll != nil {
			toApply = append(toApply, e)
		} else if err := apply(ctx, tx, e); err != nil {
			return res, &consumers.ApplyError{Envelope: e, Err: err}
		}
		if ordered {
			pos.last = e.Revision
			pos.advanced = true
		}
		out.Disposition = core.DispositionApplied
		res.Outcomes[i] = out
	}
	if len(toApply) > 0 {
		if err := applyAll(ctx, tx, toApply); err != nil {
			return res, &consumers.ApplyError{Envelope: toApply[0], Err: err}
		}
	}
	if ordered {
		for ref, pos := range positions {
			if pos.advanced {
				advance.aggTypes = append(advance.aggTypes, ref.Type)
				advance.aggIDs = append(advance.aggIDs, ref.ID)
				advance.revisions = append(advance.revisions, pos.last)
			}
		}
		if len(advance.aggIDs) > 0 {
			if _, err := tx.Exec(ctx, `
				UPDATE consumer_positions p SET last_revision = u.revision, updated_at = now()
				FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(aggregate_type, aggregate_id, revision)
				WHERE p.consumer = $1 AND p.aggregate_type = u.aggregate_type AND p.aggregate_id = u.aggregate_id`,
				consumer, advance.aggTypes, advance.aggIDs, advance.revisions); err != nil {
				return res, fmt.Errorf("inbox: advance positions: %w", err)
			}
			// Held successors of the advanced aggregates: read under their
			// position locks, so no other instance can hold one of them
			// unseen before this commit (it would have to lock first).
			rows, err := tx.Query(ctx, `
				SELECT DISTINCT i.aggregate_type, i.aggregate_id
				FROM consumer_inbox i
				JOIN unnest($2::text[], $3::text[]) AS u(aggregate_type, aggregate_id)
				  ON i.aggregate_type = u.aggregate_type AND i.aggregate_id = u.aggregate_id
				WHERE i.consumer = $1 AND i.disposition = 'held'`,
				consumer, advance.aggTypes, advance.aggIDs)
			if err != nil {
				return res, fmt.Errorf("inbox: held successors: %w", err)
			}
			if res.Held, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (consumers.Aggregate, error) {
				var a consumers.Aggregate
				return a, r.Scan(&a.Type, &a.ID)
			}); err != nil {
				return res, fmt.Errorf("inbox: held successors: %w", err)
			}
		}
	}
	return res, commitInbox(ctx, tx)
}

// inboxColumns are envelopes' fields as arrays, for unnest.
type inboxColumns struct {
	eventIDs, kinds, types, aggTypes, aggIDs []string
	revisions                                []int64
}

func (c *inboxColumns) add(e core.Envelope) {
	c.eventIDs = append(c.eventIDs, e.EventID)
	c.kinds = append(c.kinds, string(e.Kind))
	c.types = append(c.types, e.Type)
	c.aggTypes = append(c.aggTypes, e.AggregateType)
	c.aggIDs = append(c.aggIDs, e.AggregateID)
	c.revisions = append(c.revisions, e.Revision)
}

// lockInboxPositions is lockInboxPosition for many aggregates at once: it
// creates the missing position rows and locks all of them, in one sorted
// order whoever calls it.
func lockInboxPositions(ctx context.Context, tx pgx.Tx, consumer string, types, ids []string) (map[consumers.Aggregate]*inboxPosition, error) {
	if _, err := tx.Exec(ctx, `
		INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id)
		SELECT $1, u.t, u.i FROM unnest($2::text[], $3::text[]) AS u(t, i) ORDER BY u.t, u.i
		ON CONFLICT DO NOTHING`, consumer, types, ids); err != nil {
		return nil, fmt.Errorf("inbox: positions: %w", err)
	}
	rows, err := tx.Query(ctx, `
		SELECT p.aggregate_type, p.aggregate_id, p.last_revision, p.parked, coalesce(p.parked_reason, '')
		FROM consumer_positions p
		JOIN unnest($2::text[], $3::text[]) AS u(t, i) ON p.aggregate_type = u.t AND p.aggregate_id = u.i
		WHERE p.consumer = $1
		ORDER BY p.aggregate_type, p.aggregate_id
		FOR UPDATE OF p`, consumer, types, ids)
	if err != nil {
		return nil, fmt.Errorf("inbox: lock positions: %w", err)
	}
	out := make(map[consumers.Aggregate]*inboxPosition, len(ids))
	for rows.Next() {
		var ref consumers.Aggregate
		p := &inboxPosition{}
		if err := rows.Scan(&ref.Type, &ref.ID, &p.last, &p.parked, &p.reason); err != nil {
			rows.Close()
			return nil, fmt.Errorf("inbox: lock positions: %w", err)
		}
		out[ref] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: lock positions: %w", err)
	}
	if len(out) != len(ids) {
		return nil, fmt.Errorf("inbox: lock positions: %d of %d aggregates found", len(out), len(ids))
	}
	return out, nil
}
