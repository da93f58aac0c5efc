package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations
var migrations embed.FS

// Schema names one set of embedded migrations.
type Schema string

const (
	// LedgerSchema is the ledger, the outbox and the relay's tables.
	LedgerSchema Schema = "ledger"
	// ConsumerSchema is the example consumers' inbox and projections.
	ConsumerSchema Schema = "consumer"
)

// Migrate brings the schema up to date. It is idempotent and safe to run
// from several processes at once: a session advisory lock serialises them.
// Each schema keeps its own version table, so the ledger and the consumers
// may share one database.
func Migrate(ctx context.Context, dsn string, schema Schema) error {
	return migrate(ctx, dsn, schema, func(p *goose.Provider) error {
		_, err := p.Up(ctx)
		return err
	})
}

// migrate opens dsn and runs step on a provider of schema's embedded
// migrations (under the advisory lock).
func migrate(ctx context.Context, dsn string, schema Schema, step func(*goose.Provider) error) error {
	sub, err := fs.Sub(migrations, "migrations/"+string(schema))
	if err != nil {
		return fmt.Errorf("migrations for %s: %w", schema, err)
	}
	cfg, err := ParseConfig(dsn)
	if err != nil {
		return err
	}
	db := stdlib.OpenDB(*cfg.ConnConfig)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID(schema)))
	if err != nil {
		return err
	}
	store, err := database.NewStore(database.DialectPostgres, "posthorn_"+string(schema)+"_migrations")
	if err != nil {
		return err
	}
	p, err := goose.NewProvider("", db, sub,
		goose.WithStore(store),
		goose.WithSessionLocker(locker),
		goose.WithAllowOutofOrder(true),
	)
	if err != nil {
		return fmt.Errorf("migrations for %s: %w", schema, err)
	}
	if err := step(p); err != nil {
		return fmt.Errorf("migrate %s schema: %w", schema, err)
	}
	return nil
}

func lockID(s Schema) int64 {
	if s == ConsumerSchema {
		return 0x706f7374_0002
	}
	return 0x706f7374_0001
}
