// Package sqlsink is the Postgres sink, for teams whose downstream is
// another database: records are inserted with watermill-sql/v4's publisher
// into that database, in watermill-sql's own table layout (Schema: one
// table watermill_<topic> per topic, payload BYTEA, metadata JSON holding
// every contract header, uuid the event ID), so watermill-sql's subscriber,
// and so any consumer on a Watermill router, reads them.
//
// Table names are one-to-one with topics: PostgreSQL cuts an identifier at
// 63 bytes, so a topic whose table name (or offsets table name,
// watermill_offsets_<topic>) would be longer gets a readable part, '~' and
// 128 bits of the topic's SHA-256 instead (TableName). '~' is not allowed
// in a watermill-sql topic, so such a name is never a shorter topic's;
// topics short enough keep watermill-sql's default name.
//
// Delivery: a batch is inserted in ONE transaction (one multi-row INSERT
// per topic, in batch order) and Publish returns nil only after COMMIT
// returned: the commit is the ACK, and with the server's default
// synchronous_commit the rows are on disk. Either every record of the
// batch is there or none is.
//
// Order: within a topic table the offset (BIGSERIAL) follows batch order,
// and watermill-sql's subscriber reads in (transaction_id, offset) order
// behind its xmin fence, so per-account order holds. That fence also means
// a long-open unrelated transaction in the target database holds consumers
// back until it ends.
//
// Errors: a record over MaxPayloadBytes is permanent and left out of the
// transaction, together with its aggregate's later records in the batch
// (retryably). Any SQL error fails the whole transaction, so it is
// reported for the whole batch and is retryable: the relay cannot tell
// which record caused it, and a permanent verdict would park every
// aggregate of the batch.
package sqlsink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/internal/sinkgate"
	"github.com/posthorn/posthorn/core"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("postgres sink closed")

// MaxPayloadBytesDefault bounds a payload (a BYTEA value may be up to 1 GiB).
const MaxPayloadBytesDefault = 256 << 20

// maxRowsPerInsert keeps an INSERT under Postgres' 65,535 bind parameters
// (three per row).
const maxRowsPerInsert = 5000

// Schema is the table layout the sink writes and the subscribers read:
// watermill-sql's default PostgreSQL schema with a BYTEA payload, because
// payloads are opaque bytes, not necessarily JSON, and a table name per
// topic that PostgreSQL does not cut short (TableName).
func Schema() wmsql.DefaultPostgreSQLSchema {
	return wmsql.DefaultPostgreSQLSchema{
		GeneratePayloadType:       func(string) string { return "BYTEA" },
		GenerateMessagesTableName: func(topic string) string { return quoteIdent(TableName("watermill_", topic)) },
	}
}

// OffsetsAdapter is where the subscribers keep their offsets: watermill-sql's
// default PostgreSQL offsets tables, named as TableName does.
func OffsetsAdapter() wmsql.DefaultPostgreSQLOffsetsAdapter {
	return wmsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string { return quoteIdent(TableName("watermill_offsets_", topic)) },
	}
}

// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN - 1): a
// longer name is silently cut to it.
const maxIdentifier = 63

// TableName is prefix + topic when that fits in a PostgreSQL identifier;
// otherwise prefix, as much of the topic as fits, '~' and 32 hex digits of
// the topic's SHA-256, 63 bytes in all.
func TableName(prefix, topic string) string {
	if len(prefix)+len(topic) <= maxIdentifier {
		return prefix + topic
	}
	sum := sha256.Sum256([]byte(topic))
	h := hex.EncodeToString(sum[:16])
	return prefix + topic[:maxIdentifier-len(prefix)-1-len(h)] + "~" + h
}

// quoteIdent quotes a table name; watermill-sql's topic check keeps '"'
// out of topics, so there is nothing to escape.
func quoteIdent(name string) string { return `"` + name + `"` }

// Config configures the Postgres sink; only URL is required.
type Config struct {
	// URL is the target database (TLS through sslmode and friends in it).
	URL string
	// MaxPayloadBytes rejects larger payloads permanently; default
	// MaxPayloadBytesDefault.
	MaxPayloadBytes int
}

// Sink inserts batches into another Postgres database.
type Sink struct {
	cfg    Config
	pool   *pgxpool.Pool
	schema wmsql.DefaultPostgreSQLSchema

	tables sync.Map // topic → struct{}: table known to exist

	gate sinkgate.Gate
}

var _ core.Sink = (*Sink)(nil)

// New parses cfg; the pool connects on first use, so a database that is
// down at start is retried like any outage.
func New(cfg Config) (*Sink, error) {
	if cfg.URL == "" {
		return nil, errors.New("postgres sink: no URL")
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = MaxPayloadBytesDefault
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// pgx's message may quote the URL: say only what is wrong.
		return nil, errors.New("postgres sink: the URL is not a valid Postgres URL or DSN")
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("postgres sink: %w", err)
	}
	return &Sink{cfg: cfg, pool: pool, schema: Schema(), gate: sinkgate.Gate{Closed: ErrClosed}}, nil
}

// ensureTable creates topic's table (outside the batch's transaction:
// watermill-sql refuses to create tables inside one).
func (s *Sink) ensureTable(ctx context.Context, topic string) error {
	if _, ok := s.tables.Load(topic); ok {
		return nil
	}
	qs, err := s.schema.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return core.Permanent(fmt.Errorf("postgres sink: table of topic %q: %w", topic, err))
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, q := range qs {
			if _, err := tx.Exec(ctx, q.Query, q.Args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres sink: create table of topic %q: %w", topic, err)
	}
	s.tables.Store(topic, struct{}{})
	return nil
}

// Publish inserts the batch in one transaction and returns nil once it
// committed. If ctx ends first, the transaction is rolled back (or, if
// COMMIT was already sent, may have committed: the relay resends with the
// same event IDs).
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	return s.gate.Publish(ctx, batch, s.publish)
}

func (s *Sink) publish(ctx context.Context, batch []core.Envelope) error {
	fails := core.BatchFailures{NotSent: "postgres sink: not sent"}
	var (
		order  []string
		groups = map[string][]*message.Message{}
	)
	for i, e := range batch {
		if !sinkgate.Admit(&fails, i, e, "postgres sink", s.cfg.MaxPayloadBytes) {
			continue
		}
		if _, ok := groups[e.Topic]; !ok {
			order = append(order, e.Topic)
		}
		m := e.ToMessage()
		m.SetContext(ctx)
		groups[e.Topic] = append(groups[e.Topic], m)
	}
	for _, topic := range order {
		if err := s.ensureTable(ctx, topic); err != nil {
			return err
		}
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		pub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: s.schema}, nil)
		if err != nil {
			return err
		}
		for _, topic := range order {
			msgs := groups[topic]
			for len(msgs) > 0 {
				n := min(len(msgs), maxRowsPerInsert)
				if err := pub.Publish(topic, msgs[:n]...); err != nil {
					return err
				}
				msgs = msgs[n:]
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("postgres sink: batch transaction: %w", err)
	}
	return fails.Err()
}

// Close waits for a Publish in progress and closes the pool; a second
// Close returns nil.
func (s *Sink) Close() error {
	return s.gate.Close(func() error {
		s.pool.Close()
		return nil
	})
}
