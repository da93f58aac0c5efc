// Package publish writes events and commands into Posthorn's outbox inside
// the caller's own PostgreSQL transaction, for a team's own service with
// its own tables: what the caller commits reaches the sink, in order per
// aggregate; what it rolls back never does.
//
//	tx, _ := pool.Begin(ctx)
//	// … the service's own writes …
//	p, err := publish.Pgx(tx).Event(ctx, publish.Message{
//		AggregateType: "wallet", AggregateID: "w-42", Type: "wallet.credited",
//		Payload: []byte(`{"amount":"12.50"}`),
//	})
//	// … tx.Commit(ctx)
//
// Invariants:
//   - Per aggregate, outbox id order is revision order, whoever writes: each
//     message is written by the SQL function posthorn.write, which first
//     takes its aggregate's row lock in posthorn_aggregates, held to the end
//     of the caller's transaction, and only then inserts the outbox row. A
//     second writer of the aggregate waits, so its row comes after; the
//     caller needs no locking discipline of its own.
//   - Revisions are gapless (1, 2, 3 …). With Message.Revision set (the
//     caller keeps its own), anything but the next one is refused with
//     ErrRevision naming the next.
//   - The caller's database role needs no table privilege: membership of
//     posthorn_publisher (EXECUTE on the functions) is enough, so a
//     service cannot write the ledger or another aggregate's rows.
//   - The event ID is a UUIDv7 and the shard core.ShardOf(AggregateID), as
//     on the Posting API's path; the payload is stored byte for byte.
//   - Commands go to the command topic prefix configured in the database
//     (sink.command_topic_prefix, written by posthorn migrate), never to
//     one of the caller's choosing.
//   - The SQL functions posthorn_publish and posthorn_send_command do the
//     same from any language, with the same lock, checks and errors.
//   - When ctx holds an OpenTelemetry span, its W3C trace context
//     (traceparent, tracestate) goes into the row's headers, so the relay's
//     publish span and the consumers' apply spans join the caller's trace.
//
// A refused message names its field (*FieldError) or its revision
// (ErrRevision). A payload that is not JSON is refused before anything is
// sent, and the transaction stays usable; every other refusal comes from
// the database and fails the caller's transaction (PostgreSQL aborts it):
// roll it back.
package publish

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/posthorn/posthorn/core"
)

// Message is one event or command to publish.
type Message struct {
	// AggregateType names the kind of thing the message is about (e.g.
	// wallet); account and journal are the ledger's own and refused.
	// Events go to the topic events.<AggregateType>.
	AggregateType string
	// AggregateID is the thing itself: the order and the record key.
	AggregateID string
	// Type is e.g. wallet.credited; for a command, its first segment names
	// the owning service (commands.<service>).
	Type string
	// Payload is a JSON document.
	Payload []byte
	// Headers are extra wire headers; contract headers are refused.
	Headers map[string]string
	// Revision, when not 0, must be the aggregate's next revision.
	Revision int64
	// SchemaVersion is the version of Payload's schema for Type (header
	// schema_version; 0 means 1), so consumers can handle old and new
	// payloads side by side (consumers.Versions).
	SchemaVersion int
}

// Published is what a published message got.
type Published struct {
	EventID  string
	Revision int64
	Topic    string
}

// ErrRevision is a Message.Revision that is not the aggregate's next.
var ErrRevision = errors.New("revision is not the next")

// FieldError is a message refused for one field.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "publish: " + e.Field + ": " + e.Reason }

// Publisher publishes into one transaction of the caller's.
type Publisher struct {
	q querier
	// commandPrefix, when set, is checked against the configured prefix.
	commandPrefix *string
}

// querier is what both drivers' transactions offer.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) row
}

type row interface{ Scan(dest ...any) error }

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) QueryRowContext(ctx context.Context, q string, args ...any) row {
	return t.tx.QueryRow(ctx, q, args...)
}

type stdTx struct{ tx *sql.Tx }

func (t stdTx) QueryRowContext(ctx context.Context, q string, args ...any) row {
	return t.tx.QueryRowContext(ctx, q, args...)
}

// Pgx publishes in tx.
func Pgx(tx pgx.Tx) *Publisher { return &Publisher{q: pgxTx{tx}} }

// StdSQL publishes in tx, a database/sql transaction of the pgx driver
// (github.com/jackc/pgx/v5/stdlib).
func StdSQL(tx *sql.Tx) *Publisher { return &Publisher{q: stdTx{tx}} }

// WithCommandTopicPrefix states the command topic prefix the caller
// expects. Commands always go to the prefix configured in the database
// (sink.command_topic_prefix, written by posthorn migrate); a different
// one is refused with a *FieldError for topic_prefix, so a service built
// for another prefix fails loudly instead of publishing where its
// consumers do not read.
func (p *Publisher) WithCommandTopicPrefix(prefix string) *Publisher {
	q := *p
	q.commandPrefix = &prefix
	return &q
}

// Event publishes m as an event.
func (p *Publisher) Event(ctx context.Context, m Message) (Published, error) {
	return p.publish(ctx, core.KindEvent, m)
}

// Command publishes m as a command to its service's command topic.
func (p *Publisher) Command(ctx context.Context, m Message) (Published, error) {
	return p.publish(ctx, core.KindCommand, m)
}

func (p *Publisher) publish(ctx context.Context, kind core.Kind, m Message) (Published, error) {
	if !json.Valid(m.Payload) {
		return Published{}, &FieldError{Field: "payload", Reason: "is not a JSON document"}
	}
	// The caller's span, when its context has one, continues through the
	// relay's publish span to the consumers' (as a posting's does).
	headers := maps.Clone(m.Headers)
	if headers == nil {
		headers = map[string]string{}
	}
	maps.Copy(headers, core.TraceHeaders(ctx))
	if m.SchemaVersion < 0 {
		return Published{}, &FieldError{Field: "schema_version", Reason: fmt.Sprintf("is %d, want 1 or more (or 0: 1)", m.SchemaVersion)}
	}
	if m.SchemaVersion > 0 {
		headers[core.HeaderSchemaVersion] = strconv.Itoa(m.SchemaVersion)
	}
	hJSON, err := json.Marshal(headers)
	if err != nil {
		return Published{}, err
	}
	var want *int64
	if m.Revision != 0 {
		want = &m.Revision
	}
	var out Published
	err = p.q.QueryRowContext(ctx, `SELECT event_id::text, revision, topic FROM posthorn.write($1, $2, $3, $4, $5::text::json, $6::text::jsonb, $7, $8)`,
		string(kind), m.AggregateType, m.AggregateID, m.Type, string(m.Payload), string(hJSON), want, p.commandPrefix).Scan(&out.EventID, &out.Revision, &out.Topic)
	if err != nil {
		return Published{}, refusal(err)
	}
	return out, nil
}

// refusal turns the database's refusal of a message into *FieldError or
// ErrRevision; other errors pass through.
func refusal(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("publish: %w", err)
	}
	switch pgErr.Code {
	case "22023":
		field, reason, _ := strings.Cut(pgErr.Message, ": ")
		return &FieldError{Field: field, Reason: reason}
	case "PH001":
		_, reason, _ := strings.Cut(pgErr.Message, ": ")
		return fmt.Errorf("publish: %w: %s", ErrRevision, reason)
	}
	return fmt.Errorf("publish: %w", err)
}
