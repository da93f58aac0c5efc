package inboxstore

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
//
// The steps: sort the events into (aggregate, revision) order; lock the
// positions of their aggregates (ordered) and insert every inbox row, in
// one round trip; decide each event's disposition, applying those next in
// line; apply the run with applyAll; advance the positions and find the
// aggregates with held successors (ordered), in one round trip; commit.
func (in *Inbox) ReceiveBatch(ctx context.Context, consumer string, ordered bool, es []core.Envelope, apply consumers.Handler, applyAll consumers.BatchHandler) (consumers.BatchOutcome, error) {
	res := consumers.BatchOutcome{Outcomes: make([]consumers.Outcome, len(es))}
	order := applyOrder(es)
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()

	b := inboxBatch{in: in, tx: tx, consumer: consumer, ordered: ordered, es: es, order: order, res: &res}
	if err := b.lockAndInsert(ctx); err != nil {
		return res, err
	}
	toApply, err := b.decide(ctx, apply, applyAll != nil)
	if err != nil {
		return res, err
	}
	if len(toApply) > 0 {
		if err := applyAll(ctx, tx, toApply); err != nil {
			return res, &consumers.ApplyError{Envelope: toApply[0], Err: err}
		}
	}
	if ordered {
		if res.Held, err = b.advancePositions(ctx); err != nil {
			return res, err
		}
	}
	return res, commitInbox(ctx, tx)
}

// applyOrder is the order ReceiveBatch records es in: by aggregate, then
// revision, then event ID (stable, so repeats keep their delivery order).
func applyOrder(es []core.Envelope) []int {
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
	return order
}

// inboxBatch is one ReceiveBatch in its transaction.
type inboxBatch struct {
	in       *Inbox
	tx       pgx.Tx
	consumer string
	ordered  bool
	es       []core.Envelope
	order    []int
	res      *consumers.BatchOutcome
	// positions are the locked positions of an ordered consumer's
	// aggregates; decide advances them in memory.
	positions map[core.AggregateKey]*inboxPosition
	// fresh holds the event IDs whose row this batch inserted (decide
	// removes each as it decides it); inserted lists them all.
	fresh    map[string]bool
	inserted []string
	// appliedBefore maps an unordered consumer's event IDs to the event ID
	// applied at their aggregate revision before this batch, where one was
	// (read before the rows were inserted).
	appliedBefore map[string]string
	// appliedHere maps the aggregate revisions this batch applied to their
	// event IDs.
	appliedHere map[revisionKey]string
}

// lockAndInsert locks the positions of an ordered consumer's aggregates
// (creating the missing ones, in one sorted order whoever calls, so
// batches of several instances serialise per aggregate without
// deadlocking), then inserts every inbox row: one round trip. The primary
// key decides which delivery owns an event (as in Receive); the
// provisional disposition is replaced in this transaction where needed.
func (b *inboxBatch) lockAndInsert(ctx context.Context) error {
	batch := &pgx.Batch{}
	var types, ids []string
	if b.ordered {
		seen := map[core.AggregateKey]bool{}
		for _, i := range b.order {
			ref := b.es[i].Aggregate()
			if !seen[ref] {
				seen[ref] = true
				types, ids = append(types, ref.Type), append(ids, ref.ID)
			}
		}
		batch.Queue(`
		INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id)
		SELECT $1, u.t, u.i FROM unnest($2::text[], $3::text[]) AS u(t, i) ORDER BY u.t, u.i
		ON CONFLICT DO NOTHING`, b.consumer, types, ids)
		batch.Queue(`
		SELECT p.aggregate_type, p.aggregate_id, p.last_revision, p.parked, coalesce(p.parked_reason, '')
		FROM consumer_positions p
		JOIN unnest($2::text[], $3::text[]) AS u(t, i) ON p.aggregate_type = u.t AND p.aggregate_id = u.i
		WHERE p.consumer = $1
		ORDER BY p.aggregate_type, p.aggregate_id
		FOR UPDATE OF p`, b.consumer, types, ids)
	}
	cols := inboxColumns{}
	for _, i := range b.order {
		cols.add(b.es[i])
	}
	lookUp := !b.ordered && !b.in.revisionOnly
	if lookUp {
		// An unordered consumer may receive any event ID at any time, so
		// each one is looked up (an ordered consumer looks up only a
		// revision at or below its position, in decide). Before the
		// insert, so no row of this batch is found.
		batch.Queue(`
		SELECT u.event_id, min(i.event_id)
		FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(event_id, aggregate_type, aggregate_id, revision)
		JOIN consumer_inbox i ON i.consumer = $1 AND i.aggregate_type = u.aggregate_type AND i.aggregate_id = u.aggregate_id
		     AND i.revision = u.revision AND i.disposition = 'applied' AND i.event_id <> u.event_id
		GROUP BY u.event_id`, b.consumer, cols.eventIDs, cols.aggTypes, cols.aggIDs, cols.revisions)
	}
	batch.Queue(`
		INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
		SELECT $1, u.event_id, u.kind, u.type, u.aggregate_type, u.aggregate_id, u.revision, 'applied'
		FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[])
		     AS u(event_id, kind, type, aggregate_type, aggregate_id, revision)
		ON CONFLICT (consumer, event_id) DO NOTHING
		RETURNING event_id`,
		b.consumer, cols.eventIDs, cols.kinds, cols.types, cols.aggTypes, cols.aggIDs, cols.revisions)
	br := b.tx.SendBatch(ctx, batch)
	defer br.Close()
	if b.ordered {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("inbox: positions: %w", err)
		}
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("inbox: lock positions: %w", err)
		}
		if b.positions, err = scanPositions(rows); err != nil {
			return err
		}
		if len(b.positions) != len(ids) {
			return fmt.Errorf("inbox: lock positions: %d of %d aggregates found", len(b.positions), len(ids))
		}
	}
	if lookUp {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("inbox: applied events: %w", err)
		}
		b.appliedBefore = map[string]string{}
		var id, applied string
		if _, err := pgx.ForEachRow(rows, []any{&id, &applied}, func() error {
			b.appliedBefore[id] = applied
			return nil
		}); err != nil {
			return fmt.Errorf("inbox: applied events: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("inbox: insert: %w", err)
	}
	b.inserted, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("inbox: insert: %w", err)
	}
	b.fresh = make(map[string]bool, len(b.inserted))
	for _, id := range b.inserted {
		b.fresh[id] = true
	}
	return br.Close()
}

// scanPositions reads locked position rows.
func scanPositions(rows pgx.Rows) (map[core.AggregateKey]*inboxPosition, error) {
	out := map[core.AggregateKey]*inboxPosition{}
	for rows.Next() {
		var ref core.AggregateKey
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
	return out, nil
}

// decide records each event's outcome in order: a repeat, a revision
// conflict, one not next in line (ordered), or applied — with apply at
// once, or, when deferred, returned for the caller to apply as one run.
func (b *inboxBatch) decide(ctx context.Context, apply consumers.Handler, deferred bool) ([]core.Envelope, error) {
	var toApply []core.Envelope
	b.appliedHere = map[revisionKey]string{}
	appliedAt := b.in.appliedAt(ctx, b.tx, b.consumer, b.appliedHere, b.inserted)
	for _, i := range b.order {
		e := b.es[i]
		out := consumers.OutcomeOf(e)
		if !b.fresh[e.EventID] {
			// A repeat: the event ID had a row before this batch, or an
			// earlier delivery in this batch took it.
			if err := countInboxRepeat(ctx, b.tx, b.consumer, &out); err != nil {
				return nil, err
			}
			b.res.Outcomes[i] = out
			continue
		}
		delete(b.fresh, e.EventID) // a second delivery in this batch is a repeat
		var pos *inboxPosition
		if b.ordered {
			pos = b.positions[e.Aggregate()]
			waits, err := notNextInLine(ctx, b.tx, b.consumer, e, pos, &out, appliedAt)
			if err != nil {
				return nil, err
			}
			if waits {
				b.res.Outcomes[i] = out
				continue
			}
		} else if applied := b.appliedUnordered(e); applied != "" {
			if err := recordConflict(ctx, b.tx, b.consumer, false, e, applied, nil, &out); err != nil {
				return nil, err
			}
			b.res.Outcomes[i] = out
			continue
		}
		out.Disposition = core.DispositionApplied
		switch {
		case e.Type == core.TypeDeadLettered:
			if err := applyOrSkip(ctx, b.tx, b.consumer, e, apply, &out); err != nil {
				return nil, err
			}
		case deferred:
			toApply = append(toApply, e)
		default:
			if err := apply(ctx, b.tx, e); err != nil {
				return nil, &consumers.ApplyError{Envelope: e, Err: err}
			}
		}
		if b.ordered {
			pos.last = e.Revision
			pos.advanced = true
		}
		b.appliedHere[revisionKeyOf(e)] = e.EventID
		b.res.Outcomes[i] = out
	}
	return toApply, nil
}

// appliedUnordered is the event ID an unordered consumer applied at e's
// aggregate revision, in this batch or before it ("" when none, and always
// with revisionOnly).
func (b *inboxBatch) appliedUnordered(e core.Envelope) string {
	if b.in.revisionOnly {
		return ""
	}
	if id, ok := b.appliedHere[revisionKeyOf(e)]; ok {
		return id
	}
	return b.appliedBefore[e.EventID]
}

// advancePositions writes back the positions decide advanced and returns
// those of their aggregates that have held successors.
func (b *inboxBatch) advancePositions(ctx context.Context) ([]core.AggregateKey, error) {
	var advance inboxColumns
	for ref, pos := range b.positions {
		if pos.advanced {
			advance.aggTypes = append(advance.aggTypes, ref.Type)
			advance.aggIDs = append(advance.aggIDs, ref.ID)
			advance.revisions = append(advance.revisions, pos.last)
		}
	}
	if len(advance.aggIDs) == 0 {
		return nil, nil
	}
	// Held successors of the advanced aggregates: read under their
	// position locks, so no other instance can hold one of them unseen
	// before this commit (it would have to lock first). One round trip
	// with the update.
	batch := &pgx.Batch{}
	batch.Queue(`
		UPDATE consumer_positions p SET last_revision = u.revision, updated_at = now()
		FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(aggregate_type, aggregate_id, revision)
		WHERE p.consumer = $1 AND p.aggregate_type = u.aggregate_type AND p.aggregate_id = u.aggregate_id`,
		b.consumer, advance.aggTypes, advance.aggIDs, advance.revisions)
	batch.Queue(`
		SELECT DISTINCT i.aggregate_type, i.aggregate_id
		FROM consumer_inbox i
		JOIN unnest($2::text[], $3::text[]) AS u(aggregate_type, aggregate_id)
		  ON i.aggregate_type = u.aggregate_type AND i.aggregate_id = u.aggregate_id
		WHERE i.consumer = $1 AND i.disposition = 'held'`,
		b.consumer, advance.aggTypes, advance.aggIDs)
	br := b.tx.SendBatch(ctx, batch)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("inbox: advance positions: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("inbox: held successors: %w", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowToStructByPos[core.AggregateKey])
	if err != nil {
		return nil, fmt.Errorf("inbox: held successors: %w", err)
	}
	return held, br.Close()
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
