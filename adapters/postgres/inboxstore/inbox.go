package inboxstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

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
//
// It implements consumers.Inbox (this file, inbox_batch, inbox_park) for
// the consumers and ops.Inbox (inbox_status, inbox_retention) for the
// operators' reconciliation and retention.
type Inbox struct {
	pool *pgxpool.Pool
	// revisionOnly: NewUnsafeRevisionOnly.
	revisionOnly bool
	// creating holds, per consumer, whether ReceiveBatch creates the
	// positions of its aggregates before it locks them (*atomic.Bool):
	// set when a batch found one missing, cleared when a batch created
	// none.
	creating sync.Map
}

var (
	_ consumers.Inbox = (*Inbox)(nil)
	_ ops.Inbox       = (*Inbox)(nil)
)

// New returns the store on the consumer's database (migrated with
// ConsumerSchema).
func New(pool *pgxpool.Pool) *Inbox { return &Inbox{pool: pool} }

// NewUnsafeRevisionOnly is New with the rule that lost real
// postings after a ledger failover: an event at or below its aggregate's
// last applied revision is a duplicate whatever its event ID, and an
// unordered consumer applies every new event ID. It exists for negative
// controls in tests (it shows the conflicts the inbox now records being
// absorbed silently); do not use it in production.
func NewUnsafeRevisionOnly(pool *pgxpool.Pool) *Inbox {
	return &Inbox{pool: pool, revisionOnly: true}
}

// Receive records one delivered event and, when it is next in line, applies
// it with apply in the same transaction.
//
// Unordered: a new event ID is applied, unless its aggregate revision was
// applied under another event ID (RevisionConflict, not applied); a known
// one is a repeat.
// Ordered: revision ≤ last applied is a RevisionConflict when the inbox
// names another event ID applied at it (the aggregate parks), else a
// Duplicate; last+1 is applied; higher is Held (with its headers and
// payload, so it can be re-driven by Drain once the predecessor is
// applied); any other event of a parked aggregate is ParkedGap. After an outcome with HeldSuccessors the caller should Drain
// the aggregate.
//
// A failing apply returns *consumers.ApplyError and records nothing; other errors are
// the database's. Both leave the delivery unacknowledged-safe: nothing was
// committed.
func (in *Inbox) Receive(ctx context.Context, consumer string, ordered bool, e core.Envelope, apply consumers.Handler) (consumers.Outcome, error) {
	out := consumers.OutcomeOf(e)
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

	appliedAt := in.appliedAt(ctx, tx, consumer, nil, []string{e.EventID})
	if ordered {
		waits, err := notNextInLine(ctx, tx, consumer, e, &pos, &out, appliedAt)
		if err != nil {
			return out, err
		}
		if waits {
			return out, commitInbox(ctx, tx)
		}
	} else {
		applied, err := appliedAt(e)
		if err != nil {
			return out, err
		}
		if applied != "" {
			if err := recordConflict(ctx, tx, consumer, false, e, applied, nil, &out); err != nil {
				return out, err
			}
			return out, commitInbox(ctx, tx)
		}
	}

	if err := applyOrSkip(ctx, tx, consumer, e, apply, &out); err != nil {
		return out, err
	}
	if ordered {
		// Under the position lock, like ReceiveBatch's held successors: a
		// drain transaction after every applied event found nothing
		// almost always (at 100 postings/s, nearly a third of the consumers'
		// transactions). One round trip with the advance.
		batch := &pgx.Batch{}
		batch.Queue(advancePositionSQL, consumer, e.AggregateType, e.AggregateID, e.Revision)
		batch.Queue(`
			SELECT EXISTS (SELECT 1 FROM consumer_inbox
			               WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND disposition = 'held')`,
			consumer, e.AggregateType, e.AggregateID)
		br := tx.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return out, fmt.Errorf("inbox: advance position: %w", err)
		}
		if err := br.QueryRow().Scan(&out.HeldSuccessors); err != nil {
			_ = br.Close()
			return out, fmt.Errorf("inbox: held successors: %w", err)
		}
		if err := br.Close(); err != nil {
			return out, fmt.Errorf("inbox: held successors: %w", err)
		}
	}
	if out.Disposition != core.DispositionSkipped {
		out.Disposition = core.DispositionApplied
	}
	return out, commitInbox(ctx, tx)
}

// applyOrSkip applies e with apply, or, when e is a skip marker
// (core.TypeDeadLettered: an operator dead-lettered the record the sink
// could never take), records its row as skipped, naming the dead-lettered
// type, without calling the handler: the caller then advances past its
// revision as for an applied event. A failing apply is an
// *consumers.ApplyError.
func applyOrSkip(ctx context.Context, tx pgx.Tx, consumer string, e core.Envelope, apply consumers.Handler, out *consumers.Outcome) error {
	if e.Type != core.TypeDeadLettered {
		if err := apply(ctx, tx, e); err != nil {
			return &consumers.ApplyError{Envelope: e, Err: err}
		}
		return nil
	}
	out.Disposition, out.Reason = core.DispositionSkipped, skipReason(e)
	return setInboxDisposition(ctx, tx, consumer, e.EventID, core.DispositionSkipped, out.Reason, 0)
}

// skipReason names what a skip marker stands for: its payload names the
// dead-lettered record's type (ledger migration 00013).
func skipReason(e core.Envelope) string {
	var marker struct {
		Type string `json:"dead_lettered_type"`
	}
	_ = json.Unmarshal(e.Payload, &marker) // a marker without it is still a skip
	return fmt.Sprintf("skipped: revision %d was dead-lettered by an operator (type %.128q; the record is in the ledger's dead_letters table)",
		e.Revision, marker.Type)
}

// Drain re-drives the aggregate's held events from the inbox, in revision
// order, each in its own transaction with its inbox row, until none is next
// in line (ordered) or none is left (unordered). It returns what it
// recorded; on a failing apply it stops and returns *consumers.ApplyError naming the
// event, which stays held (the caller parks it if the failure is
// permanent). Any instance may drain any aggregate: the position lock
// serialises them.
func (in *Inbox) Drain(ctx context.Context, consumer string, ordered bool, aggregateType, aggregateID string, apply consumers.Handler) ([]consumers.Outcome, error) {
	var outs []consumers.Outcome
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

func (in *Inbox) drainOne(ctx context.Context, consumer string, ordered bool, aggregateType, aggregateID string, apply consumers.Handler) (consumers.Outcome, bool, error) {
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return consumers.Outcome{}, false, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var pos inboxPosition
	if ordered {
		if pos, err = lockInboxPosition(ctx, tx, consumer, aggregateType, aggregateID); err != nil {
			return consumers.Outcome{}, false, err
		}
		if pos.parked {
			return consumers.Outcome{}, false, nil
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
		return consumers.Outcome{}, false, nil
	}
	if err != nil {
		return consumers.Outcome{}, false, fmt.Errorf("inbox: next held: %w", err)
	}
	e, err := storedInboxEnvelope(eventID, headers, payload)
	if err != nil {
		return consumers.Outcome{}, false, err
	}
	out := consumers.OutcomeOf(e)
	if ordered {
		switch {
		case rev <= pos.last:
			// A different event ID took the revision while this one was
			// held: a conflict (the aggregate parks, so the drain stops), or
			// a duplicate when the inbox has no applied event to compare.
			if _, err := notNextInLine(ctx, tx, consumer, e, &pos, &out, in.appliedAt(ctx, tx, consumer, nil, []string{eventID})); err != nil {
				return out, false, err
			}
			return out, true, commitInbox(ctx, tx)
		case rev > pos.last+1:
			return out, false, nil // still a gap
		}
	}
	out.Disposition = core.DispositionApplied
	if err := applyOrSkip(ctx, tx, consumer, e, apply, &out); err != nil {
		return out, false, err
	}
	if ordered {
		if err := advanceInboxPosition(ctx, tx, consumer, e); err != nil {
			return out, false, err
		}
	}
	if err := setInboxDisposition(ctx, tx, consumer, eventID, out.Disposition, out.Reason, 0); err != nil {
		return out, false, err
	}
	return out, true, commitInbox(ctx, tx)
}

// ParkPoison records that the handler failed permanently on e: the event is
// kept (headers and payload) as ParkedPoison with reason. For an ordered
// consumer the aggregate is parked too, and its held events wait behind it
// as ParkedGap. If e meanwhile got another disposition (another instance
// applied it), the delivery is counted as a repeat instead.
func (in *Inbox) ParkPoison(ctx context.Context, consumer string, ordered bool, e core.Envelope, reason string) (consumers.Outcome, error) {
	out := consumers.OutcomeOf(e)
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
		out.Disposition, out.Repeat, out.Reason = core.DispositionDuplicate, true, "event already has a disposition"
		return out, commitInbox(ctx, tx)
	}
	out.Disposition, out.Reason = core.DispositionParkedPoison, reason
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
func (in *Inbox) Reject(ctx context.Context, consumer, eventID string, e core.Envelope, headers map[string]string, payload []byte, reason string) (consumers.Outcome, error) {
	out := consumers.OutcomeOf(e)
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
		out.Disposition, out.Repeat, out.Reason = core.DispositionDuplicate, true, "event ID already recorded"
		return out, nil
	}
	out.Disposition, out.Reason = core.DispositionRejected, reason
	return out, nil
}

type inboxPosition struct {
	last   int64
	parked bool
	reason string
	// advanced: ReceiveBatch applied an event of the aggregate and must
	// write last back.
	advanced bool
	// ctid is where ReceiveBatch found the locked row; moved is set once
	// this transaction updated the row (a park), after which the row is
	// found by its key, not there.
	ctid  pgtype.TID
	moved bool
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

// advancePositionSQL sets the aggregate's last applied revision:
// $1 consumer, $2 aggregate type, $3 aggregate ID, $4 revision.
const advancePositionSQL = `
		UPDATE consumer_positions SET last_revision = $4, updated_at = now()
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`

func advanceInboxPosition(ctx context.Context, tx pgx.Tx, consumer string, e core.Envelope) error {
	if _, err := tx.Exec(ctx, advancePositionSQL, consumer, e.AggregateType, e.AggregateID, e.Revision); err != nil {
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
func keepInInbox(ctx context.Context, tx pgx.Tx, consumer string, e core.Envelope, d core.Disposition, reason string) error {
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
func setInboxDisposition(ctx context.Context, tx pgx.Tx, consumer, eventID string, d core.Disposition, reason string, duplicates int) error {
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

func commitInbox(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: commit: %w", err)
	}
	return nil
}

// countInboxRepeat counts a delivery of an event ID that already has a row
// on that row, and makes out a Duplicate repeat.
func countInboxRepeat(ctx context.Context, tx pgx.Tx, consumer string, out *consumers.Outcome) error {
	var was core.Disposition
	if err := tx.QueryRow(ctx, `
		UPDATE consumer_inbox SET duplicates = duplicates + 1, updated_at = now()
		WHERE consumer = $1 AND event_id = $2 RETURNING disposition`,
		consumer, out.EventID).Scan(&was); err != nil {
		return fmt.Errorf("inbox: count repeat: %w", err)
	}
	out.Disposition, out.Repeat = core.DispositionDuplicate, true
	out.Reason = "event ID already recorded as " + string(was)
	return nil
}

// notNextInLine records the disposition of an ordered consumer's new event
// that is not next in line at pos: a revision already applied (a
// RevisionConflict when appliedAt names another event ID applied at it,
// which parks the aggregate and updates pos; else a Duplicate), any event
// of a parked aggregate (ParkedGap, kept), or one past a gap (Held, kept).
// It returns false, recording nothing, for revision last+1 of an unparked
// aggregate: the caller applies it.
func notNextInLine(ctx context.Context, tx pgx.Tx, consumer string, e core.Envelope, pos *inboxPosition, out *consumers.Outcome, appliedAt func(core.Envelope) (string, error)) (bool, error) {
	switch {
	case e.Revision <= pos.last:
		applied, err := appliedAt(e)
		if err != nil {
			return true, err
		}
		if applied != "" {
			return true, recordConflict(ctx, tx, consumer, true, e, applied, pos, out)
		}
		out.Disposition = core.DispositionDuplicate
		out.Reason = fmt.Sprintf("revision %d already applied (last applied %d); no applied event of it is recorded here to compare IDs with", e.Revision, pos.last)
		return true, setInboxDisposition(ctx, tx, consumer, e.EventID, core.DispositionDuplicate, out.Reason, 1)
	case pos.parked:
		out.Disposition = core.DispositionParkedGap
		out.Reason = "aggregate parked: " + pos.reason
		return true, keepInInbox(ctx, tx, consumer, e, core.DispositionParkedGap, out.Reason)
	case e.Revision > pos.last+1:
		out.Disposition, out.GapDetected = core.DispositionHeld, true
		out.Reason = fmt.Sprintf("revision gap: last applied %d, received %d", pos.last, e.Revision)
		return true, keepInInbox(ctx, tx, consumer, e, core.DispositionHeld, out.Reason)
	}
	return false, nil
}

// appliedAt returns the lookup of the event ID applied at an event's
// aggregate revision ("" when none): first in here (the events a batch
// applied in this transaction, by aggregate and revision), then in the inbox,
// skipping the rows of exclude (rows this transaction inserted and has not
// applied: their provisional disposition is not a decision). With
// revisionOnly it finds nothing, which is the old rule.
func (in *Inbox) appliedAt(ctx context.Context, tx pgx.Tx, consumer string, here map[revisionKey]string, exclude []string) func(core.Envelope) (string, error) {
	return func(e core.Envelope) (string, error) {
		if in.revisionOnly {
			return "", nil
		}
		if id, ok := here[revisionKeyOf(e)]; ok {
			return id, nil
		}
		var id string
		err := tx.QueryRow(ctx, appliedAtSQL, consumer, e.AggregateType, e.AggregateID, e.Revision, exclude).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("inbox: applied event of %s %s revision %d: %w", e.AggregateType, e.AggregateID, e.Revision, err)
		}
		return id, nil
	}
}

// appliedAtSQL is the least event ID consumer $1 applied at aggregate $2
// $3's revision $4, other than those in $5: appliedBeforeSQL for one
// event, planned key by key whatever the statistics say for the same
// reasons (a redelivery after a restart runs it for every event again).
const appliedAtSQL = `
			SELECT a.event_id
			FROM (SELECT $1::text AS consumer OFFSET 0) AS c
			CROSS JOIN LATERAL (
			    SELECT (array_agg(i.event_id ORDER BY i.event_id))[1] AS event_id FROM consumer_inbox i
			    WHERE i.consumer = c.consumer AND i.aggregate_type = $2 AND i.aggregate_id = $3 AND i.revision = $4
			      AND (i.disposition = 'applied') IS TRUE AND i.event_id <> ALL($5::text[])) a
			WHERE a.event_id IS NOT NULL`

// revisionKey is one aggregate revision.
type revisionKey struct {
	core.AggregateKey
	revision int64
}

func revisionKeyOf(e core.Envelope) revisionKey {
	return revisionKey{AggregateKey: e.Aggregate(), revision: e.Revision}
}

// recordConflict records e, whose revision was applied as event applied, as
// a RevisionConflict naming both IDs, and keeps it with its headers and
// payload; nothing is applied. For an ordered consumer the aggregate is
// parked with the same reason (pos, when given, follows), unless a conflict
// parked it already: the first conflict stays the park's reason. The SQL
// inbox (posthorn_inbox_receive) writes the same.
func recordConflict(ctx context.Context, tx pgx.Tx, consumer string, ordered bool, e core.Envelope, applied string, pos *inboxPosition, out *consumers.Outcome) error {
	out.Disposition, out.ConflictsWith = core.DispositionRevisionConflict, applied
	out.Reason = conflictReason(e, applied)
	headers, err := json.Marshal(e.WireHeaders())
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `
		UPDATE consumer_inbox SET disposition = 'revision_conflict', conflicts_with = $3, reason = $4,
		       headers = $5, payload = $6, held_since = now(), updated_at = now()
		WHERE consumer = $1 AND event_id = $2`,
		consumer, e.EventID, applied, out.Reason, headers, e.Payload); err != nil {
		return fmt.Errorf("inbox: record revision conflict: %w", err)
	}
	if !ordered || (pos.parked && strings.HasPrefix(pos.reason, conflictReasonPrefix)) {
		return nil
	}
	if err := parkInboxAggregate(ctx, tx, consumer, e.AggregateType, e.AggregateID, out.Reason); err != nil {
		return err
	}
	pos.parked, pos.reason, pos.moved = true, out.Reason, true
	return nil
}

// conflictReasonPrefix starts the reason of a conflict and of the park it
// causes.
const conflictReasonPrefix = "revision_conflict:"

func conflictReason(e core.Envelope, applied string) string {
	return fmt.Sprintf("%s revision %d applied as event %s, received as event %s", conflictReasonPrefix, e.Revision, applied, e.EventID)
}
