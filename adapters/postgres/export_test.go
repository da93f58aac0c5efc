package postgres

import (
	"context"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
)

// NewLedgerStoreWithSchemaForBench is NewLedgerStore writing its outbox
// through schema instead of OutboxSchema: the write benchmark's baselines
// (the journal alone, Watermill's stock schema) on the very same path.
func NewLedgerStoreWithSchemaForBench(pool *pgxpool.Pool, schema wsql.SchemaAdapter) *LedgerStore {
	s := NewLedgerStore(pool, LedgerConfig{})
	s.schema = schema
	return s
}

// ScramVerifierForTest exposes scramVerifier with a given salt, so a test
// can compare it with the verifier PostgreSQL computes.
var ScramVerifierForTest = scramVerifier

// MigrateToForTest migrates schema up to version only, so a test can put
// rows in place the way an older release wrote them before the rest runs.
func MigrateToForTest(ctx context.Context, dsn string, schema Schema, version int64) error {
	return migrate(ctx, dsn, schema, func(p *goose.Provider) error {
		_, err := p.UpTo(ctx, version)
		return err
	})
}

// The relay's read and its settings, for the plan test.
var (
	ReadByIDForTest     = readByID
	ReadSettingsForTest = readSettings
)
