package ledgerstore

import (
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/posthorn/posthorn/adapters/postgres/internal/outboxrow"
	"github.com/posthorn/posthorn/core"
)

// OutboxSchema is the watermill-sql schema adapter of the outbox table. It
// only writes: Watermill's SQL publisher calls InsertQuery inside the
// posting transaction, and the bridge, not a Watermill subscriber, reads the
// table (with keyset queries Watermill's subscriber cannot express).
//
// Each message must carry the contract's wire headers as metadata, as
// core.Envelope.ToMessage sets them; the adapter reads the row's columns
// back from them, computes the shard from the aggregate ID (so no caller
// can put an aggregate on another shard) and stores only the remaining,
// non-contract headers in the headers column. The row's xid comes from the
// column default, pg_current_xact_id().
//
// All rows of one Publish go in one INSERT … SELECT FROM unnest(…), so the
// statement text is the same for any number of rows and stays prepared.
type OutboxSchema struct{}

var _ wsql.SchemaAdapter = OutboxSchema{}

// ErrOutboxReadOnly is returned by the reading half of the SchemaAdapter
// interface, which the outbox does not support.
var ErrOutboxReadOnly = errors.New("the outbox schema adapter only inserts; the bridge reads the outbox")

const outboxInsert = `INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id,
    revision, shard, journal_id, headers, payload, occurred_at)
SELECT e::uuid, k, t, tp, at, ai, r, s, NULLIF(j, '')::uuid, h::jsonb, p, o
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
    $7::bigint[], $8::int[], $9::text[], $10::text[], $11::bytea[], $12::timestamptz[])
    AS u(e, k, t, tp, at, ai, r, s, j, h, p, o)`

// InsertQuery builds the insert of params.Msgs into the outbox under
// params.Topic. A message without valid contract headers is refused, which
// fails the Publish and therefore the posting transaction.
func (OutboxSchema) InsertQuery(params wsql.InsertQueryParams) (wsql.Query, error) {
	n := len(params.Msgs)
	var (
		ids, kinds, types, topics, aggTypes, aggIDs, journals, headers = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		revisions                                                      = make([]int64, n)
		shards                                                         = make([]int32, n)
		payloads                                                       = make([][]byte, n)
		occurred                                                       = make([]time.Time, n)
	)
	for i, msg := range params.Msgs {
		env, err := core.EnvelopeFromMessage(msg)
		if err != nil {
			return wsql.Query{}, fmt.Errorf("outbox message %d: %w", i, err)
		}
		if env.EventID != msg.UUID {
			return wsql.Query{}, fmt.Errorf("outbox message %d: %w: UUID %q differs from header %s %q", i, core.ErrBadEnvelope, msg.UUID, core.HeaderEventID, env.EventID)
		}
		if env.OccurredAt.IsZero() {
			return wsql.Query{}, fmt.Errorf("outbox message %d: %w: header %q missing", i, core.ErrBadEnvelope, core.HeaderOccurredAt)
		}
		extra := make(map[string]string)
		for k, v := range msg.Metadata {
			if outboxrow.Stored(k, v) {
				extra[k] = v
			}
		}
		h, err := json.Marshal(extra)
		if err != nil {
			return wsql.Query{}, fmt.Errorf("outbox message %d headers: %w", i, err)
		}
		ids[i], kinds[i], types[i], topics[i] = env.EventID, string(env.Kind), env.Type, params.Topic
		aggTypes[i], aggIDs[i], journals[i], headers[i] = env.AggregateType, env.AggregateID, env.JournalID, string(h)
		revisions[i] = env.Revision
		shards[i] = int32(core.ShardOf(env.AggregateID))
		payloads[i] = msg.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{} // the column is NOT NULL
		}
		occurred[i] = env.OccurredAt
	}
	return wsql.Query{
		Query: outboxInsert,
		Args:  []any{ids, kinds, types, topics, aggTypes, aggIDs, revisions, shards, journals, headers, payloads, occurred},
	}, nil
}

// SelectQuery is not supported: see ErrOutboxReadOnly.
func (OutboxSchema) SelectQuery(wsql.SelectQueryParams) (wsql.Query, error) {
	return wsql.Query{}, ErrOutboxReadOnly
}

// UnmarshalMessage is not supported: see ErrOutboxReadOnly.
func (OutboxSchema) UnmarshalMessage(wsql.UnmarshalMessageParams) (wsql.Row, error) {
	return wsql.Row{}, ErrOutboxReadOnly
}

// SchemaInitializingQueries refuses: the outbox is created by the embedded
// migrations (posthorn migrate), never on the fly inside a posting.
func (OutboxSchema) SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams) ([]wsql.Query, error) {
	return nil, errors.New("the outbox table is created by posthorn migrate, not by the publisher")
}

// SubscribeIsolationLevel is unused (nothing subscribes through this adapter).
func (OutboxSchema) SubscribeIsolationLevel() stdsql.IsolationLevel {
	return stdsql.LevelReadCommitted
}
