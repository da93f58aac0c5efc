// Package auditlog is the example consumer audit-log: it stores every
// event as received (table audit_log). Each row stands alone, so it does
// not depend on the predecessor: events are applied as they come, in any
// order, each exactly once through the inbox.
package auditlog

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// Name is the consumer name (its inbox rows and Kafka consumer group).
const Name = "audit-log"

// Register adds the audit log to reg for the events on topic.
func Register(reg *consumers.Registry, topic string, opts ...consumers.Option) error {
	return reg.AddEventHandler(Name, topic, Handle, opts...)
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
		INSERT INTO audit_log (event_id, type, aggregate_type, aggregate_id, revision, journal_id, occurred_at, replay, payload)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb)
		ON CONFLICT (event_id) DO NOTHING`,
		e.EventID, e.Type, e.AggregateType, e.AggregateID, e.Revision, journal, occurred, e.Replay, string(e.Payload))
	return err
}
