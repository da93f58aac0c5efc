package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// Disposition is what a consumer did with an event ID (mission.md,
// vocabulary). Reconciliation reads them through Inbox.Dispositions.
type Disposition string

const (
	// DispositionHeld is transient: the event arrived ahead of its predecessor and
	// waits in the inbox, inside the hold time, for the gap to close.
	DispositionHeld Disposition = "held"
	// DispositionApplied: the handler's effect committed with the inbox row.
	DispositionApplied Disposition = "applied"
	// DispositionDuplicate: the event's revision was already applied under another
	// event ID. Repeats of an event ID that already has a row are counted in
	// that row's Duplicates instead.
	DispositionDuplicate Disposition = "duplicate"
	// DispositionParkedGap: the event waits behind a missing predecessor (or behind a
	// parked event of its aggregate) until an operator releases the park.
	DispositionParkedGap Disposition = "parked_gap"
	// DispositionParkedPoison: the handler failed permanently on this event.
	DispositionParkedPoison Disposition = "parked_poison"
	// DispositionRejected: the record can never be applied by this consumer (bad
	// envelope, or a command delivered to an event handler or the reverse).
	DispositionRejected Disposition = "rejected"
)

// AllDispositions lists every disposition, DispositionHeld included.
var AllDispositions = []Disposition{DispositionHeld, DispositionApplied, DispositionDuplicate, DispositionParkedGap, DispositionParkedPoison, DispositionRejected}

// ApplyFunc is a consumer's effect: it runs inside the transaction that
// also writes the event's inbox row, so both commit or neither does.
type ApplyFunc func(ctx context.Context, tx pgx.Tx, e core.Envelope) error

// ApplyBatchFunc applies a run of events in one call, inside the
// transaction that writes their inbox rows, with the effect of an ApplyFunc
// called for each in the order given.
type ApplyBatchFunc func(ctx context.Context, tx pgx.Tx, es []core.Envelope) error

// ApplyError is returned when the ApplyFunc failed; the transaction was
// rolled back and nothing was recorded. Envelope is the event it failed on
// (for Drain, one that was re-driven from the inbox).
type ApplyError struct {
	Envelope core.Envelope
	Err      error
}

func (e *ApplyError) Error() string {
	return fmt.Sprintf("handler failed on event %s (%s %s revision %d): %v",
		e.Envelope.EventID, e.Envelope.AggregateType, e.Envelope.AggregateID, e.Envelope.Revision, e.Err)
}

func (e *ApplyError) Unwrap() error { return e.Err }

// InboxOutcome is the disposition recorded for one delivery or re-drive.
type InboxOutcome struct {
	EventID       string
	AggregateType string
	AggregateID   string
	Revision      int64
	Disposition   Disposition
	// Repeat is set when the event ID already had a row: the delivery was
	// absorbed and counted in that row's duplicates. Disposition is then
	// Duplicate.
	Repeat bool
	Reason string
	// GapDetected is set when this delivery found a revision gap (the
	// event is Held).
	GapDetected bool
}

// Inbox is the consumers' store: the inbox rows (one per consumer and
// event ID) and the per-aggregate positions of consumers whose handler
// depends on the predecessor ("ordered").
//
// Locking: every operation on an ordered consumer's aggregate first locks
// that aggregate's position row, then touches inbox rows of that aggregate,
// so instances and the sweeper serialise per aggregate without deadlocks.
// For unordered consumers the inbox primary key alone serialises two
// instances receiving the same event: the second INSERT waits for the first
// transaction and then conflicts.
type Inbox struct {
	pool *pgxpool.Pool
}

// NewInbox returns the store on the consumer's database (migrated with
// ConsumerSchema).
func NewInbox(pool *pgxpool.Pool) *Inbox { return &Inbox{pool: pool} }

// Pool is the consumer's database.
func (in *Inbox) Pool() *pgxpool.Pool { return in.pool }

// Receive records one delivered event and, when it is next in line, applies
// it with apply in the same transaction.
//
// Unordered: a new event ID is applied; a known one is a repeat.
// Ordered: revision ≤ last applied is Duplicate; last+1 is applied; higher
// is Held (with its headers and payload, so it can be re-driven by Drain
// once the predecessor is applied); any event of a parked aggregate is
// ParkedGap. After an Applied outcome the caller should Drain the aggregate.
//
// A failing apply returns *ApplyError and records nothing; other errors are
// the database's. Both leave the delivery unacknowledged-safe: nothing was
// committed.
func (in *Inbox) Receive(ctx context.Context, consumer string, ordered bool, e core.Envelope, apply ApplyFunc) (InboxOutcome, error) {
	out := inboxOutcomeOf(e)
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()

	var pos inboxPosition
	if ordered {
		if pos, err = lockInboxPosition(ctx, tx, consumer, e.AggregateType, e.AggregateID); err != nil {
			return out, err
		}
	}
	// Insert first: the primary key decides which delivery owns the event.
	// The provisional disposition is replaced below in this transaction, so
	// no one ever sees it.
	tag, err := tx.Exec(ctx, `
		INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'applied')
		ON CONFLICT (consumer, event_id) DO NOTHING`,
		consumer, e.EventID, string(e.Kind), e.Type, e.AggregateType, e.AggregateID, e.Revision)
	if err != nil {
		return out, fmt.Errorf("inbox: insert: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if err := countInboxRepeat(ctx, tx, consumer, &out); err != nil {
			return out, err
		}
		return out, commitInbox(ctx, tx)
	}

	if ordered {
		waits, err := notNextInLine(ctx, tx, consumer, e, pos, &out)
		if err != nil {
			return out, err
		}
		if waits {
			return out, commitInbox(ctx, tx)
		}
	}

	if err := apply(ctx, tx, e); err != nil {
		return out, &ApplyError{Envelope: e, Err: err}
	}
	if ordered {
		if err := advanceInboxPosition(ctx, tx, consumer, e); err != nil {
			return out, err
		}
	}
	out.Disposition = DispositionApplied
	return out, commitInbox(ctx, tx)
}

// Drain re-drives the aggregate's held events from the inbox, in revision
// order, each in its own transaction with its inbox row, until none is next
// in line (ordered) or none is left (unordered). It returns what it
// recorded; on a failing apply it stops and returns *ApplyError naming the
// event, which stays held (the caller parks it if the failure is
// permanent). Any instance may drain any aggregate: the position lock
// serialises them.
func (in *Inbox) Drain(ctx context.Context, consumer string, ordered bool, aggregateType, aggregateID string, apply ApplyFunc) ([]InboxOutcome, error) {
	var outs []InboxOutcome
	for {
		out, more, err := in.drainOne(ctx, consumer, ordered, aggregateType, aggregateID, apply)
		if err != nil {
			return outs, err
		}
		if !more {
			return outs, nil
		}
		outs = append(outs, out)
	}
}

func (in *Inbox) drainOne(ctx context.Context, consumer string, ordered bool, aggregateType, aggregateID string, apply ApplyFunc) (InboxOutcome, bool, error) {
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return InboxOutcome{}, false, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var pos inboxPosition
	if ordered {
		if pos, err = lockInboxPosition(ctx, tx, consumer, aggregateType, aggregateID); err != nil {
			return InboxOutcome{}, false, err
		}
		if pos.parked {
			return InboxOutcome{}, false, nil
		}
	}
	var (
		eventID string
		rev     int64
		headers []byte
		payload []byte
	)
	err = tx.QueryRow(ctx, `
		SELECT event_id, revision, headers, payload FROM consumer_inbox
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND disposition = 'held'
		ORDER BY revision, event_id LIMIT 1 FOR UPDATE SKIP LOCKED`,
		consumer, aggregateType, aggregateID).Scan(&eventID, &rev, &headers, &payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return InboxOutcome{}, false, nil
	}
	if err != nil {
		return InboxOutcome{}, false, fmt.Errorf("inbox: next held: %w", err)
	}
	e, err := storedInboxEnvelope(eventID, headers, payload)
	if err != nil {
		return InboxOutcome{}, false, err
	}
	out := inboxOutcomeOf(e)
	if ordered {
		switch {
		case rev <= pos.last:
			out.Disposition = DispositionDuplicate
			out.Reason = fmt.Sprintf("revision %d already applied (last applied %d)", rev, pos.last)
			if err := setInboxDisposition(ctx, tx, consumer, eventID, DispositionDuplicate, out.Reason, 1); err != nil {
				return out, false, err
			}
			return out, true, commitInbox(ctx, tx)
		case rev > pos.last+1:
			return out, false, nil // still a gap
		}
	}
	if err := apply(ctx, tx, e); err != nil {
		return out, false, &ApplyError{Envelope: e, Err: err}
	}
	if ordered {
		if err := advanceInboxPosition(ctx, tx, consumer, e); err != nil {
			return out, false, err
		}
	}
	if err := setInboxDisposition(ctx, tx, consumer, eventID, DispositionApplied, "", 0); err != nil {
		return out, false, err
	}
	out.Disposition = DispositionApplied
	return out, true, commitInbox(ctx, tx)
}

// ParkPoison records that the handler failed permanently on e: the event is
// kept (headers and payload) as ParkedPoison with reason. For an ordered
// consumer the aggregate is parked too, and its held events wait behind it
// as ParkedGap. If e meanwhile got another disposition (another instance
// applied it), the delivery is counted as a repeat instead.
func (in *Inbox) ParkPoison(ctx context.Context, consumer string, ordered bool, e core.Envelope, reason string) (InboxOutcome, error) {
	out := inboxOutcomeOf(e)
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if ordered {
		if _, err := lockInboxPosition(ctx, tx, consumer, e.AggregateType, e.AggregateID); err != nil {
			return out, err
		}
	}
	headers, err := json.Marshal(e.WireHeaders())
	if err != nil {
		return out, err
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO consumer_inbox AS i (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision,
		                                 disposition, reason, headers, payload)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'parked_poison', $8, $9, $10)
		ON CONFLICT (consumer, event_id) DO UPDATE
		   SET disposition = 'parked_poison', reason = EXCLUDED.reason, headers = EXCLUDED.headers,
		       payload = EXCLUDED.payload, updated_at = now()
		 WHERE i.disposition = 'held'`,
		consumer, e.EventID, string(e.Kind), e.Type, e.AggregateType, e.AggregateID, e.Revision,
		reason, headers, e.Payload)
	if err != nil {
		return out, fmt.Errorf("inbox: park poison: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if _, err := tx.Exec(ctx, `UPDATE consumer_inbox SET duplicates = duplicates + 1, updated_at = now()
			WHERE consumer = $1 AND event_id = $2`, consumer, e.EventID); err != nil {
			return out, fmt.Errorf("inbox: count repeat: %w", err)
		}
		out.Disposition, out.Repeat, out.Reason = DispositionDuplicate, true, "event already has a disposition"
		return out, commitInbox(ctx, tx)
	}
	out.Disposition, out.Reason = DispositionParkedPoison, reason
	if ordered {
		posReason := fmt.Sprintf("poison at revision %d (event %s): %s", e.Revision, e.EventID, reason)
		if err := parkInboxAggregate(ctx, tx, consumer, e.AggregateType, e.AggregateID, posReason); err != nil {
			return out, err
		}
	}
	return out, commitInbox(ctx, tx)
}

// Reject records a delivery that can never be applied by this consumer.
// eventID may come from the record's UUID when the header is missing; the
// envelope fields are whatever could be read. A repeat is counted.
func (in *Inbox) Reject(ctx context.Context, consumer, eventID string, e core.Envelope, headers map[string]string, payload []byte, reason string) (InboxOutcome, error) {
	out := inboxOutcomeOf(e)
	out.EventID = eventID
	h, err := json.Marshal(headers)
	if err != nil {
		return out, err
	}
	var inserted bool
	err = in.pool.QueryRow(ctx, `
		INSERT INTO consumer_inbox AS i (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision,
		                                 disposition, reason, headers, payload)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'rejected', $8, $9, $10)
		ON CONFLICT (consumer, event_id) DO UPDATE SET duplicates = i.duplicates + 1, updated_at = now()
		RETURNING (xmax = 0)`,
		consumer, eventID, string(e.Kind), e.Type, e.AggregateType, e.AggregateID, e.Revision,
		reason, h, payload).Scan(&inserted)
	if err != nil {
		return out, fmt.Errorf("inbox: reject: %w", err)
	}
	if !inserted {
		out.Disposition, out.Repeat, out.Reason = DispositionDuplicate, true, "event ID already recorded"
		return out, nil
	}
	out.Disposition, out.Reason = DispositionRejected, reason
	return out, nil
}

// InboxAggregate names one aggregate.
type InboxAggregate struct {
	Type string
	ID   string
}

// InboxParked is an aggregate parked by ParkExpiredHolds or ParkPoison.
type InboxParked struct {
	InboxAggregate
	Reason   string
	ParkedAt time.Time
	// Events is how many of its events wait in the inbox.
	Events int
}

// ParkExpiredHolds parks every aggregate of an ordered consumer whose
// oldest held event has waited longer than hold while its predecessor is
// still missing: the position is parked with a reason naming the missing
// revisions, and its held events become ParkedGap. They stay in the inbox
// with their payloads until Release.
func (in *Inbox) ParkExpiredHolds(ctx context.Context, consumer string, hold time.Duration) ([]InboxParked, error) {
	rows, err := in.pool.Query(ctx, `
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
	refs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxAggregate, error) {
		var a InboxAggregate
		return a, r.Scan(&a.Type, &a.ID)
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: expired holds: %w", err)
	}
	var parked []InboxParked
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

func (in *Inbox) parkExpired(ctx context.Context, consumer string, ref InboxAggregate, hold time.Duration) (InboxParked, bool, error) {
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return InboxParked{}, false, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	pos, err := lockInboxPosition(ctx, tx, consumer, ref.Type, ref.ID)
	if err != nil || pos.parked {
		return InboxParked{}, false, err
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
		return InboxParked{}, false, fmt.Errorf("inbox: expired holds: %w", err)
	}
	// No held rows any more (the aggregates of nothing are NULL), not yet
	// expired, or the predecessor arrived: nothing to park.
	if minRevP == nil || sinceP == nil || expiredP == nil || !*expiredP || *minRevP <= pos.last+1 {
		return InboxParked{}, false, nil
	}
	minRev, since := *minRevP, *sinceP
	missing := fmt.Sprintf("%d", pos.last+1)
	if minRev-1 > pos.last+1 {
		missing = fmt.Sprintf("%d..%d", pos.last+1, minRev-1)
	}
	reason := fmt.Sprintf("revision gap: last applied %d, missing %s, next held %d, held since %s",
		pos.last, missing, minRev, since.UTC().Format(time.RFC3339))
	if err := parkInboxAggregate(ctx, tx, consumer, ref.Type, ref.ID, reason); err != nil {
		return InboxParked{}, false, err
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM consumer_inbox
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND disposition = 'parked_gap'`,
		consumer, ref.Type, ref.ID).Scan(&n); err != nil {
		return InboxParked{}, false, err
	}
	if err := commitInbox(ctx, tx); err != nil {
		return InboxParked{}, false, err
	}
	return InboxParked{InboxAggregate: ref, Reason: reason, Events: n, ParkedAt: time.Now()}, true, nil
}

// Runnable lists aggregates with held events that Drain would apply now:
// for an ordered consumer, unparked aggregates whose first held revision is
// next in line (or already applied); for an unordered one, any aggregate
// with held events (released poison).
func (in *Inbox) Runnable(ctx context.Context, consumer string, ordered bool) ([]InboxAggregate, error) {
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
	rows, err := in.pool.Query(ctx, q, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: runnable: %w", err)
	}
	refs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxAggregate, error) {
		var a InboxAggregate
		return a, r.Scan(&a.Type, &a.ID)
	})
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

// InboxRecord is one event's inbox row as reconciliation reads it.
type InboxRecord struct {
	EventID       string
	AggregateType string
	AggregateID   string
	Revision      int64
	Disposition   Disposition
	Reason        string
	// Duplicates is how many repeats of this event ID were absorbed.
	Duplicates int
	ReceivedAt time.Time
	UpdatedAt  time.Time
}

// Dispositions returns the inbox rows of the given event IDs for consumer;
// an event ID without a row is absent from the map (the consumer has not
// seen it).
func (in *Inbox) Dispositions(ctx context.Context, consumer string, eventIDs []string) (map[string]InboxRecord, error) {
	rows, err := in.pool.Query(ctx, `
		SELECT event_id, aggregate_type, aggregate_id, revision, disposition, coalesce(reason, ''),
		       duplicates, received_at, updated_at
		FROM consumer_inbox WHERE consumer = $1 AND event_id = ANY($2)`, consumer, eventIDs)
	if err != nil {
		return nil, fmt.Errorf("inbox: dispositions: %w", err)
	}
	recs, err := pgx.CollectRows(rows, scanInboxRecord)
	if err != nil {
		return nil, fmt.Errorf("inbox: dispositions: %w", err)
	}
	m := make(map[string]InboxRecord, len(recs))
	for _, r := range recs {
		m[r.EventID] = r
	}
	return m, nil
}

// List returns up to limit rows of consumer with disposition d, oldest first.
func (in *Inbox) List(ctx context.Context, consumer string, d Disposition, limit int) ([]InboxRecord, error) {
	rows, err := in.pool.Query(ctx, `
		SELECT event_id, aggregate_type, aggregate_id, revision, disposition, coalesce(reason, ''),
		       duplicates, received_at, updated_at
		FROM consumer_inbox WHERE consumer = $1 AND disposition = $2
		ORDER BY received_at, event_id LIMIT $3`, consumer, string(d), limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	recs, err := pgx.CollectRows(rows, scanInboxRecord)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	return recs, nil
}

func scanInboxRecord(r pgx.CollectableRow) (InboxRecord, error) {
	var rec InboxRecord
	var d string
	err := r.Scan(&rec.EventID, &rec.AggregateType, &rec.AggregateID, &rec.Revision, &d, &rec.Reason,
		&rec.Duplicates, &rec.ReceivedAt, &rec.UpdatedAt)
	rec.Disposition = Disposition(d)
	return rec, err
}

// InboxCounts summarises one consumer's inbox.
type InboxCounts struct {
	// Events is the number of event IDs per disposition.
	Events map[Disposition]int64
	// DuplicatesAbsorbed is every repeat the inbox kept from the handler:
	// repeats of known event IDs plus events whose revision was already
	// applied.
	DuplicatesAbsorbed int64
	// ParkedAggregates is how many aggregates are parked.
	ParkedAggregates int64
}

// Count returns the consumer's InboxCounts.
func (in *Inbox) Count(ctx context.Context, consumer string) (InboxCounts, error) {
	c := InboxCounts{Events: make(map[Disposition]int64)}
	rows, err := in.pool.Query(ctx, `
		SELECT disposition, count(*), sum(duplicates) FROM consumer_inbox
		WHERE consumer = $1 GROUP BY disposition`, consumer)
	if err != nil {
		return c, fmt.Errorf("inbox: count: %w", err)
	}
	for rows.Next() {
		var d string
		var n, dup int64
		if err := rows.Scan(&d, &n, &dup); err != nil {
			rows.Close()
			return c, fmt.Errorf("inbox: count: %w", err)
		}
		c.Events[Disposition(d)] = n
		c.DuplicatesAbsorbed += dup
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("inbox: count: %w", err)
	}
	if err := in.pool.QueryRow(ctx, `SELECT count(*) FROM consumer_positions WHERE consumer = $1 AND parked`,
		consumer).Scan(&c.ParkedAggregates); err != nil {
		return c, fmt.Errorf("inbox: count: %w", err)
	}
	return c, nil
}

// Parked lists the consumer's parked aggregates with their reasons.
func (in *Inbox) Parked(ctx context.Context, consumer string) ([]InboxParked, error) {
	rows, err := in.pool.Query(ctx, `
		SELECT p.aggregate_type, p.aggregate_id, coalesce(p.parked_reason, ''), p.parked_at,
		       (SELECT count(*) FROM consumer_inbox i
		         WHERE i.consumer = p.consumer AND i.aggregate_type = p.aggregate_type
		           AND i.aggregate_id = p.aggregate_id AND i.disposition IN ('parked_gap', 'parked_poison'))
		FROM consumer_positions p WHERE p.consumer = $1 AND p.parked
		ORDER BY p.parked_at, p.aggregate_id`, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: parked: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxParked, error) {
		var p InboxParked
		return p, r.Scan(&p.Type, &p.ID, &p.Reason, &p.ParkedAt, &p.Events)
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: parked: %w", err)
	}
	return out, nil
}

// LastRevision is the last applied revision of an ordered consumer's
// aggregate (0 if none).
func (in *Inbox) LastRevision(ctx context.Context, consumer, aggregateType, aggregateID string) (int64, error) {
	var last int64
	err := in.pool.QueryRow(ctx, `SELECT last_revision FROM consumer_positions
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
		consumer, aggregateType, aggregateID).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return last, err
}

type inboxPosition struct {
	last   int64
	parked bool
	reason string
	// advanced: ReceiveBatch applied an event of the aggregate and must
	// write last back.
	advanced bool
}

// lockInboxPosition creates the aggregate's position row if needed and locks it
// for the rest of the transaction.
func lockInboxPosition(ctx context.Context, tx pgx.Tx, consumer, aggregateType, aggregateID string) (inboxPosition, error) {
	if _, err := tx.Exec(ctx, `
		INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id) VALUES ($1, $2, $3)
		ON CONFLICT DO NOTHING`, consumer, aggregateType, aggregateID); err != nil {
		return inboxPosition{}, fmt.Errorf("inbox: position: %w", err)
	}
	var p inboxPosition
	var reason *string
	if err := tx.QueryRow(ctx, `
		SELECT last_revision, parked, parked_reason FROM consumer_positions
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE`,
		consumer, aggregateType, aggregateID).Scan(&p.last, &p.parked, &reason); err != nil {
		return inboxPosition{}, fmt.Errorf("inbox: lock position: %w", err)
	}
	if reason != nil {
		p.reason = *reason
	}
	return p, nil
}

func advanceInboxPosition(ctx context.Context, tx pgx.Tx, consumer string, e core.Envelope) error {
	if _, err := tx.Exec(ctx, `
		UPDATE consumer_positions SET last_revision = $4, updated_at = now()
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
		consumer, e.AggregateType, e.AggregateID, e.Revision); err != nil {
		return fmt.Errorf("inbox: advance position: %w", err)
	}
	return nil
}

// parkAggregate parks the position and moves its held events behind the park.
func parkInboxAggregate(ctx context.Context, tx pgx.Tx, consumer, aggregateType, aggregateID, reason string) error {
	if _, err := tx.Exec(ctx, `
		UPDATE consumer_positions SET parked = true, parked_reason = $4, parked_at = now(), updated_at = now()
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
		consumer, aggregateType, aggregateID, reason); err != nil {
		return fmt.Errorf("inbox: park: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE consumer_inbox SET disposition = 'parked_gap', reason = 'aggregate parked: ' || $4, updated_at = now()
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND disposition = 'held'`,
		consumer, aggregateType, aggregateID, reason); err != nil {
		return fmt.Errorf("inbox: park held events: %w", err)
	}
	return nil
}

// keep stores the event with its headers and payload so that it can be
// re-driven from the inbox after the broker message is acknowledged.
func keepInInbox(ctx context.Context, tx pgx.Tx, consumer string, e core.Envelope, d Disposition, reason string) error {
	headers, err := json.Marshal(e.WireHeaders())
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `
		UPDATE consumer_inbox SET disposition = $3, reason = $4, headers = $5, payload = $6,
		       held_since = now(), updated_at = now()
		WHERE consumer = $1 AND event_id = $2`,
		consumer, e.EventID, string(d), reason, headers, e.Payload); err != nil {
		return fmt.Errorf("inbox: keep %s: %w", d, err)
	}
	return nil
}

// setDisposition finalises a row; the kept copy of the event is dropped.
func setInboxDisposition(ctx context.Context, tx pgx.Tx, consumer, eventID string, d Disposition, reason string, duplicates int) error {
	var r *string
	if reason != "" {
		r = &reason
	}
	if _, err := tx.Exec(ctx, `
		UPDATE consumer_inbox SET disposition = $3, reason = coalesce($4, reason), duplicates = duplicates + $5,
		       headers = NULL, payload = NULL, updated_at = now()
		WHERE consumer = $1 AND event_id = $2`,
		consumer, eventID, string(d), r, duplicates); err != nil {
		return fmt.Errorf("inbox: set %s: %w", d, err)
	}
	return nil
}

func storedInboxEnvelope(eventID string, headers, payload []byte) (core.Envelope, error) {
	var h map[string]string
	if err := json.Unmarshal(headers, &h); err != nil {
		return core.Envelope{}, fmt.Errorf("inbox: stored headers of %s: %w", eventID, err)
	}
	e, err := core.EnvelopeFromHeaders(h, payload)
	if err != nil {
		return core.Envelope{}, fmt.Errorf("inbox: stored event %s: %w", eventID, err)
	}
	return e, nil
}

func inboxOutcomeOf(e core.Envelope) InboxOutcome {
	return InboxOutcome{EventID: e.EventID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Revision: e.Revision}
}

func commitInbox(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: commit: %w", err)
	}
	return nil
}

// Waiting returns how many of consumer's events are held and how many of
// its aggregates are parked: cheap (partial indexes), for gauges.
func (in *Inbox) Waiting(ctx context.Context, consumer string) (held, parkedAggregates int64, err error) {
	err = in.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND disposition = 'held'),
		       (SELECT count(*) FROM consumer_positions WHERE consumer = $1 AND parked)`,
		consumer).Scan(&held, &parkedAggregates)
	if err != nil {
		return 0, 0, fmt.Errorf("inbox: waiting: %w", err)
	}
	return held, parkedAggregates, nil
}

// InboxBatch is what ReceiveBatch recorded: one outcome per envelope, in
// the order given, and the aggregates of an ordered consumer that now have
// held events (the caller drains them, as after an Applied Receive).
type InboxBatch struct {
	Outcomes []InboxOutcome
	Held     []InboxAggregate
}

// ReceiveBatch records a run of deliveries in ONE transaction: one inbox
// row and at most one effect per event, one commit for all. Each event gets
// the disposition Receive would give it had the events been received one
// by one in (aggregate, revision) order — the order it applies them in, so
// a run of one aggregate's consecutive revisions is applied in a single
// transaction.
//
// It is all or nothing: on any error (a failing apply returns *ApplyError,
// a deadlock or a lost connection the database's error) the transaction is
// rolled back and nothing of the batch is recorded; the caller then
// receives the events one by one with Receive, which gives each failure its
// own handling (retry, poison). The position rows of every aggregate in the
// batch are locked in one statement, sorted, so batches of several
// instances serialise per aggregate without deadlocking each other.
//
// applyAll, when not nil, applies every event to be applied in one call
// (in that order) instead of apply once per event; an error from it is an
// *ApplyError naming the first of them.
func (in *Inbox) ReceiveBatch(ctx context.Context, consumer string, ordered bool, es []core.Envelope, apply ApplyFunc, applyAll ApplyBatchFunc) (InboxBatch, error) {
	res := InboxBatch{Outcomes: make([]InboxOutcome, len(es))}
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

	positions := map[InboxAggregate]*inboxPosition{}
	if ordered {
		var types, ids []string
		for _, i := range order {
			ref := InboxAggregate{es[i].AggregateType, es[i].AggregateID}
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
		out := inboxOutcomeOf(e)
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
			pos = positions[InboxAggregate{e.AggregateType, e.AggregateID}]
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
			return res, &ApplyError{Envelope: e, Err: err}
		}
		if ordered {
			pos.last = e.Revision
			pos.advanced = true
		}
		out.Disposition = DispositionApplied
		res.Outcomes[i] = out
	}
	if len(toApply) > 0 {
		if err := applyAll(ctx, tx, toApply); err != nil {
			return res, &ApplyError{Envelope: toApply[0], Err: err}
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
			if res.Held, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxAggregate, error) {
				var a InboxAggregate
				return a, r.Scan(&a.Type, &a.ID)
			}); err != nil {
				return res, fmt.Errorf("inbox: held successors: %w", err)
			}
		}
	}
	return res, commitInbox(ctx, tx)
}

// countInboxRepeat counts a delivery of an event ID that already has a row
// on that row, and makes out a Duplicate repeat.
func countInboxRepeat(ctx context.Context, tx pgx.Tx, consumer string, out *InboxOutcome) error {
	var was Disposition
	if err := tx.QueryRow(ctx, `
		UPDATE consumer_inbox SET duplicates = duplicates + 1, updated_at = now()
		WHERE consumer = $1 AND event_id = $2 RETURNING disposition`,
		consumer, out.EventID).Scan(&was); err != nil {
		return fmt.Errorf("inbox: count repeat: %w", err)
	}
	out.Disposition, out.Repeat = DispositionDuplicate, true
	out.Reason = "event ID already recorded as " + string(was)
	return nil
}

// notNextInLine records the disposition of an ordered consumer's new event
// that is not next in line at pos: a revision already applied (Duplicate),
// any event of a parked aggregate (ParkedGap, kept), or one past a gap
// (Held, kept). It returns false, recording nothing, for revision last+1 of
// an unparked aggregate: the caller applies it.
func notNextInLine(ctx context.Context, tx pgx.Tx, consumer string, e core.Envelope, pos inboxPosition, out *InboxOutcome) (bool, error) {
	switch {
	case e.Revision <= pos.last:
		out.Disposition = DispositionDuplicate
		out.Reason = fmt.Sprintf("revision %d already applied (last applied %d)", e.Revision, pos.last)
		return true, setInboxDisposition(ctx, tx, consumer, e.EventID, DispositionDuplicate, out.Reason, 1)
	case pos.parked:
		out.Disposition = DispositionParkedGap
		out.Reason = "aggregate parked: " + pos.reason
		return true, keepInInbox(ctx, tx, consumer, e, DispositionParkedGap, out.Reason)
	case e.Revision > pos.last+1:
		out.Disposition, out.GapDetected = DispositionHeld, true
		out.Reason = fmt.Sprintf("revision gap: last applied %d, received %d", pos.last, e.Revision)
		return true, keepInInbox(ctx, tx, consumer, e, DispositionHeld, out.Reason)
	}
	return false, nil
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
func lockInboxPositions(ctx context.Context, tx pgx.Tx, consumer string, types, ids []string) (map[InboxAggregate]*inboxPosition, error) {
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
	out := make(map[InboxAggregate]*inboxPosition, len(ids))
	for rows.Next() {
		var ref InboxAggregate
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
