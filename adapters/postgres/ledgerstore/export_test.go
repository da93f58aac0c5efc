package ledgerstore

import (
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NewWithSchemaForBench is New writing its outbox through schema instead
// of OutboxSchema: the write benchmark's baselines (the journal alone,
// Watermill's stock schema) on the very same path.
func NewWithSchemaForBench(pool *pgxpool.Pool, schema wsql.SchemaAdapter) *Store {
	s := New(pool, Config{})
	s.schema = schema
	return s
}
