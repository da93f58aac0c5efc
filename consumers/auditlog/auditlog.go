// Package auditlog is the example consumer audit-log: it stores every
// event as received (table audit_log, whose migrations it keeps beside it:
// Tables). Each row stands alone, so it does not depend on the
// predecessor: events are applied as they come, in any order, each exactly
// once through the inbox.
package auditlog

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// Name is the consumer name (its inbox rows and Kafka consumer group).
const Name = "audit-log"

// Register adds the audit log to reg for the events on topic.
func Register(reg *consumers.Registry, topic string, opts ...consumers.Option) error {
	return reg.AddEventHandler(Name, topic, Handle, append([]consumers.Option{consumers.WithBatchHandler(HandleBatch)}, opts...)...)
}

// HandleBatch is Handle for a run of events in one statement.
func HandleBatch(ctx context.Context, tx pgx.Tx, es []core.Envelope) error {
	var (
		ids, types, aggTypes, aggIDs, payloads []string
		journals, digests                      []*string
		occurred                               []*time.Time
		revisions                              []int64
		replays                                []bool
	)
	for _, e := range es {
		if !json.Valid(e.Payload) {
			return consumers.Permanent(fmt.Errorf("payload of %s is not JSON", e.EventID))
		}
		ids, types, aggTypes, aggIDs = append(ids, e.EventID), append(types, e.Type), append(aggTypes, e.AggregateType), append(aggIDs, e.AggregateID)
		payloads, revisions, replays = append(payloads, string(e.Payload)), append(revisions, e.Revision), append(replays, e.Replay)
		var j *string
		if e.JournalID != "" {
			j = &e.JournalID
		}
		var o *time.Time
		if !e.OccurredAt.IsZero() {
			t := e.OccurredAt
			o = &t
		}
		journals, occurred, digests = append(journals, j), append(occurred, o), append(digests, digestOf(e))
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO audit_log (event_id, type, aggregate_type, aggregate_id, revision, journal_id, occurred_at, replay, payload,
		                       idempotency_digest)
		SELECT u.event_id, u.type, u.aggregate_type, u.aggregate_id, u.revision, u.journal_id, u.occurred_at, u.replay, u.payload::jsonb,
		       u.digest
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::timestamptz[], $8::boolean[], $9::text[],
		            $10::text[])
		     AS u(event_id, type, aggregate_type, aggregate_id, revision, journal_id, occurred_at, replay, payload, digest)
		ON CONFLICT (event_id) DO NOTHING`,
		ids, types, aggTypes, aggIDs, revisions, journals, occurred, replays, payloads, digests)
	return err
}

// digestOf is e's idempotency digest (a ledger event's), nil if it has none.
func digestOf(e core.Envelope) *string {
	if d, ok := e.Headers[core.HeaderIdempotencyDigest]; ok && d != "" {
		return &d
	}
	return nil
}

// Handle stores one event. A payload that is not JSON can never be stored
// and is a permanent error (parked as poison).
func Handle(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
	if !json.Valid(e.Payload) {
		return consumers.Permanent(fmt.Errorf("payload of %s is not JSON", e.EventID))
	}
	var occurred any
	if !e.OccurredAt.IsZero() {
		occurred = e.OccurredAt
	}
	var journal any
	if e.JournalID != "" {
		journal = e.JournalID
	}
	// The inbox already guarantees one row per event; the primary key is a
	// second line of defence, not the mechanism.
	_, err := tx.Exec(ctx, `
		INSERT INTO audit_log (event_id, type, aggregate_type, aggregate_id, revision, journal_id, occurred_at, replay, payload,
		                       idempotency_digest)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10)
		ON CONFLICT (event_id) DO NOTHING`,
		e.EventID, e.Type, e.AggregateType, e.AggregateID, e.Revision, journal, occurred, e.Replay, string(e.Payload), digestOf(e))
	return err
}
