package inboxstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
//
// Positions exist once an aggregate's first event was received, so the
// lock finds them all but in a consumer's first pass over its aggregates.
// When it does not, the transaction is rolled back, without a lock held
// out of order, and the batch starts again creating the missing positions
// first (in the same sorted order); the consumer's next batches create
// first too, until one creates none.
func (in *Inbox) ReceiveBatch(ctx context.Context, consumer string, ordered bool, es []core.Envelope, apply consumers.Handler, applyAll consumers.BatchHandler) (consumers.BatchOutcome, error) {
	order := applyOrder(es)
	create := ordered && in.creatingPositions(consumer).Load()
	for {
		res, err := in.receiveBatch(ctx, consumer, ordered, es, order, create, apply, applyAll)
		if errors.Is(err, errPositionsMissing) && !create {
			create = true
			in.creatingPositions(consumer).Store(true)
			continue
		}
		return res, err
	}
}

// errPositionsMissing: a batch that did not create positions found one
// missing; nothing was recorded.
var errPositionsMissing = errors.New("inbox: positions missing")

func (in *Inbox) creatingPositions(consumer string) *atomic.Bool {
	c, _ := in.creating.LoadOrStore(consumer, new(atomic.Bool))
	return c.(*atomic.Bool)
}

func (in *Inbox) receiveBatch(ctx context.Context, consumer string, ordered bool, es []core.Envelope, order []int, create bool,
	apply consumers.Handler, applyAll consumers.BatchHandler) (consumers.BatchOutcome, error) {
	res := consumers.BatchOutcome{Outcomes: make([]consumers.Outcome, len(es))}
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()

	b := inboxBatch{in: in, tx: tx, consumer: consumer, ordered: ordered, es: es, order: order, res: &res}
	if err := b.lockAndInsert(ctx, create); err != nil {
		return res, err
	}
	if create && b.created == 0 {
		in.creatingPositions(consumer).Store(false)
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
	// aggregates; decide advances them in memory. created counts those
	// this batch created.
	positions map[core.AggregateKey]*inboxPosition
	created   int64
	// inserted lists the event IDs whose row this batch inserted; fresh
	// holds those decide has not decided yet (nil when the batch inserted
	// every row: then no event ID came twice or had a row before).
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
// (creating the missing ones first when create is set; without it, a
// missing one is errPositionsMissing), in one sorted order whoever calls,
// so batches of several instances serialise per aggregate without
// deadlocking, then inserts every inbox row: one round trip. The primary
// key decides which delivery owns an event (as in Receive); the
// provisional disposition is replaced in this transaction where needed.
//
// The lookups join the batch's keys to the tables LATERAL, key by key
// through their indexes: a plain join would let the planner scan the
// consumer's whole table, and on a fresh consumer database (no statistics
// until autovacuum's first analyze, about a minute) a generic plan made on
// the first few batches did so for every batch after them.
func (b *inboxBatch) lockAndInsert(ctx context.Context, create bool) error {
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
		if create {
			batch.Queue(`
		INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id)
		SELECT $1, u.t, u.i FROM unnest($2::text[], $3::text[]) AS u(t, i) ORDER BY u.t, u.i
		ON CONFLICT DO NOTHING`, b.consumer, types, ids)
		}
		batch.Queue(lockPositionsSQL, b.consumer, types, ids)
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
		batch.Queue(appliedBeforeSQL, b.consumer, cols.eventIDs, cols.aggTypes, cols.aggIDs, cols.revisions)
	}
	// The event IDs inserted come back only when some were not: in the
	// usual batch every row is new.
	batch.Queue(`
		WITH ins AS (
		    INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
		    SELECT $1, u.event_id, u.kind, u.type, u.aggregate_type, u.aggregate_id, u.revision, 'applied'
		    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[])
		         AS u(event_id, kind, type, aggregate_type, aggregate_id, revision)
		    ON CONFLICT (consumer, event_id) DO NOTHING
		    RETURNING event_id)
		SELECT count(*), CASE WHEN count(*) < $8 THEN array_agg(event_id) END FROM ins`,
		b.consumer, cols.eventIDs, cols.kinds, cols.types, cols.aggTypes, cols.aggIDs, cols.revisions, len(cols.eventIDs))
	br := b.tx.SendBatch(ctx, batch)
	defer br.Close()
	if b.ordered {
		if create {
			tag, err := br.Exec()
			if err != nil {
				return fmt.Errorf("inbox: positions: %w", err)
			}
			b.created = tag.RowsAffected()
		}
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("inbox: lock positions: %w", err)
		}
		if b.positions, err = scanPositions(rows); err != nil {
			return err
		}
		if len(b.positions) != len(ids) {
			if !create {
				return errPositionsMissing
			}
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
	var n int
	var some []string
	if err := br.QueryRow().Scan(&n, &some); err != nil {
		return fmt.Errorf("inbox: insert: %w", err)
	}
	if n == len(cols.eventIDs) {
		b.inserted = cols.eventIDs
	} else {
		b.inserted = some
		b.fresh = make(map[string]bool, len(some))
		for _, id := range some {
			b.fresh[id] = true
		}
	}
	return br.Close()
}

// lockPositionsSQL locks the positions of the aggregates $2 (types), $3
// (IDs) of consumer $1 in their sorted order and reads them with their
// ctids.
const lockPositionsSQL = `
		SELECT p.ctid, p.aggregate_type, p.aggregate_id, p.last_revision, p.parked, coalesce(p.parked_reason, '')
		FROM (SELECT u.t, u.i FROM unnest($2::text[], $3::text[]) AS u(t, i) ORDER BY u.t, u.i) u
		CROSS JOIN LATERAL (
		    SELECT p.ctid, p.* FROM consumer_positions p
		    WHERE p.consumer = $1 AND p.aggregate_type = u.t AND p.aggregate_id = u.i
		    FOR UPDATE) p`

// appliedBeforeSQL finds, for each event $2 at its aggregate revision ($3
// type, $4 ID, $5 revision), the least other event ID consumer $1 has
// applied there. The least is taken from the array of them, not with
// min() or ORDER BY … LIMIT 1, which the planner may answer by walking
// the primary key (consumer, event_id) in order, every row of the consumer
// for each event, when it believes the table empty.
//
// The plan must reach the rows through the key (consumer_inbox_revision)
// whatever the table's statistics say, and they are often wrong: none on a
// fresh database before autovacuum's first analyze (a backlog may be
// applied in that minute), or taken before this consumer's first rows (a
// consumer added to a database others fill). Either way the consumer's
// rows looked like a handful, an index on the consumer and disposition
// looked as good as the key, and the probe read every row of the consumer
// for each event: 4–6 s a batch in make bench-consumers. So the consumer
// comes from a subquery the planner keeps (OFFSET 0), a value it cannot
// look up in the statistics, whose rows it estimates as an average
// consumer's; and the disposition is tested as "IS TRUE", which no index
// can answer (TestAppliedLookupsKeyedWithStaleOrNoStatistics).
const appliedBeforeSQL = `
		SELECT u.event_id, a.event_id
		FROM (SELECT $1::text AS consumer OFFSET 0) AS c
		CROSS JOIN unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(event_id, aggregate_type, aggregate_id, revision)
		CROSS JOIN LATERAL (
		    SELECT (array_agg(i.event_id ORDER BY i.event_id))[1] AS event_id FROM consumer_inbox i
		    WHERE i.consumer = c.consumer AND i.aggregate_type = u.aggregate_type AND i.aggregate_id = u.aggregate_id
		      AND i.revision = u.revision AND (i.disposition = 'applied') IS TRUE AND i.event_id <> u.event_id) a
		WHERE a.event_id IS NOT NULL`

// scanPositions reads locked position rows.
func scanPositions(rows pgx.Rows) (map[core.AggregateKey]*inboxPosition, error) {
	out := map[core.AggregateKey]*inboxPosition{}
	for rows.Next() {
		var ref core.AggregateKey
		p := &inboxPosition{}
		if err := rows.Scan(&p.ctid, &ref.Type, &ref.ID, &p.last, &p.parked, &p.reason); err != nil {
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
		if b.fresh != nil && !b.fresh[e.EventID] {
			// A repeat: the event ID had a row before this batch, or an
			// earlier delivery in this batch took it.
			if err := countInboxRepeat(ctx, b.tx, b.consumer, &out); err != nil {
				return nil, err
			}
			b.res.Outcomes[i] = out
			continue
		}
		if b.fresh != nil {
			delete(b.fresh, e.EventID) // a second delivery in this batch is a repeat
		}
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
// those of their aggregates that have held successors. A row is found at
// the ctid its lock read, unless this transaction moved it since (a park).
func (b *inboxBatch) advancePositions(ctx context.Context) ([]core.AggregateKey, error) {
	var (
		at             []pgtype.TID
		atRevs         []int64
		moved, advance inboxColumns
	)
	for ref, pos := range b.positions {
		if !pos.advanced {
			continue
		}
		advance.aggTypes = append(advance.aggTypes, ref.Type)
		advance.aggIDs = append(advance.aggIDs, ref.ID)
		if pos.moved {
			moved.aggTypes = append(moved.aggTypes, ref.Type)
			moved.aggIDs = append(moved.aggIDs, ref.ID)
			moved.revisions = append(moved.revisions, pos.last)
		} else {
			at, atRevs = append(at, pos.ctid), append(atRevs, pos.last)
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
	if len(at) > 0 {
		batch.Queue(`
		UPDATE consumer_positions p SET last_revision = u.revision, updated_at = now()
		FROM unnest($1::tid[], $2::bigint[]) AS u(at, revision)
		WHERE p.ctid = u.at`, at, atRevs)
	}
	if len(moved.aggIDs) > 0 {
		batch.Queue(`
		UPDATE consumer_positions p SET last_revision = u.revision, updated_at = now()
		FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(aggregate_type, aggregate_id, revision)
		WHERE p.consumer = $1 AND p.aggregate_type = u.aggregate_type AND p.aggregate_id = u.aggregate_id`,
			b.consumer, moved.aggTypes, moved.aggIDs, moved.revisions)
	}
	batch.Queue(`
		SELECT DISTINCT i.aggregate_type, i.aggregate_id
		FROM consumer_inbox i
		JOIN unnest($2::text[], $3::text[]) AS u(aggregate_type, aggregate_id)
		  ON i.aggregate_type = u.aggregate_type AND i.aggregate_id = u.aggregate_id
		WHERE i.consumer = $1 AND i.disposition = 'held'`,
		b.consumer, advance.aggTypes, advance.aggIDs)
	br := b.tx.SendBatch(ctx, batch)
	defer br.Close()
	for _, want := range []int{len(at), len(moved.aggIDs)} {
		if want == 0 {
			continue
		}
		tag, err := br.Exec()
		if err != nil {
			return nil, fmt.Errorf("inbox: advance positions: %w", err)
		}
		if tag.RowsAffected() != int64(want) {
			return nil, fmt.Errorf("inbox: advance positions: %d of %d updated", tag.RowsAffected(), want)
		}
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
