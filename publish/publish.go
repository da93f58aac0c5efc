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
//     message first takes its aggregate's row lock in posthorn_aggregates
//     (posthorn_next_revision, migration 00008), held to the end of the
//     caller's transaction, and only then inserts its outbox row. A second
//     writer of the aggregate waits, so its row comes after; the caller
//     needs no locking discipline of its own.
//   - Revisions are gapless (1, 2, 3 …). With Message.Revision set (the
//     caller keeps its own), anything but the next one is refused with
//     ErrRevision naming the next.
//   - The event ID is a UUIDv7 and the shard core.ShardOf(AggregateID), as
//     on the Posting API's path; the row goes in through Watermill's SQL
//     publisher with the outbox's schema adapter, as the ledger's do.
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
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/posthorn/posthorn/adapters/postgres"
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
	tx wsql.Tx
	// commandPrefix starts command topics (sink.command_topic_prefix).
	commandPrefix string
}

// Pgx publishes in tx.
func Pgx(tx pgx.Tx) *Publisher {
	return &Publisher{tx: wsql.TxFromPgx(tx), commandPrefix: core.CommandTopicPrefix}
}

// StdSQL publishes in tx, a database/sql transaction of the pgx driver
// (github.com/jackc/pgx/v5/stdlib), whose arrays the outbox insert needs.
func StdSQL(tx *sql.Tx) *Publisher {
	return &Publisher{tx: wsql.TxFromStdSQL(tx), commandPrefix: core.CommandTopicPrefix}
}

// WithCommandTopicPrefix makes commands go to prefix<service> instead of
// commands.<service>, as sink.command_topic_prefix does for the ledger's.
func (p *Publisher) WithCommandTopicPrefix(prefix string) *Publisher {
	q := *p
	q.commandPrefix = prefix
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
	maps.Copy(headers, postgres.TraceHeaders(ctx))
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
	var out Published
	if err := p.nextRevision(ctx, kind, m, string(hJSON), &out); err != nil {
		return Published{}, refusal(err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Published{}, err
	}
	out.EventID = id.String()
	env := core.Envelope{
		EventID: out.EventID, Kind: kind, Type: m.Type, Topic: out.Topic,
		AggregateType: m.AggregateType, AggregateID: m.AggregateID, Revision: out.Revision,
		OccurredAt: time.Now().UTC(), Headers: headers, Payload: m.Payload,
	}
	pub, err := wsql.NewPublisher(p.tx, wsql.PublisherConfig{SchemaAdapter: postgres.OutboxSchema{}}, watermill.NopLogger{})
	if err != nil {
		return Published{}, err
	}
	defer func() { _ = pub.Close() }() // only marks it closed; the tx stays open
	msg := env.ToMessage()
	msg.SetContext(ctx)
	if err := pub.Publish(out.Topic, msg); err != nil {
		return Published{}, fmt.Errorf("publish: outbox insert: %w", err)
	}
	return out, nil
}

// nextRevision checks m and takes its aggregate's lock in the database
// (posthorn_next_revision), setting out's revision and topic.
func (p *Publisher) nextRevision(ctx context.Context, kind core.Kind, m Message, headers string, out *Published) error {
	var want *int64
	if m.Revision != 0 {
		want = &m.Revision
	}
	rows, err := p.tx.QueryContext(ctx, `SELECT next_revision, topic FROM posthorn_next_revision($1, $2, $3, $4, $5::text::jsonb, $6::text::jsonb, $7, $8)`,
		string(kind), m.AggregateType, m.AggregateID, m.Type, string(m.Payload), headers, want, p.commandPrefix)
	if err != nil {
		return err
	}
	defer func() { _ = rows.Close() }()
	if !rows.Next() {
		// Both drivers' rows (pgx.Rows and *sql.Rows) report why.
		if r, ok := rows.(interface{ Err() error }); ok && r.Err() != nil {
			return r.Err()
		}
		return errors.New("posthorn_next_revision returned no row")
	}
	return rows.Scan(&out.Revision, &out.Topic)
}

// refusal turns the database's refusal of a message into *FieldError or
// ErrRevision; other errors pass through.
func refusal(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "22023":
		field, reason, _ := strings.Cut(pgErr.Message, ": ")
		return &FieldError{Field: field, Reason: reason}
	case "PH001":
		_, reason, _ := strings.Cut(pgErr.Message, ": ")
		return fmt.Errorf("publish: %w: %s", ErrRevision, reason)
	}
	return err
}
