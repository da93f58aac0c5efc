package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	// ConsumerSchema is the consumers' inbox, positions, retention
	// horizons and identities; each consumer's own tables migrate from
	// its own files (Tables).
	ConsumerSchema Schema = "consumer"
)

// Migrate brings the schema up to date. It is idempotent and safe to run
// from several processes at once: a session advisory lock serialises them.
// Each schema keeps its own version table, so the ledger and the consumers
// may share one database.
func Migrate(ctx context.Context, dsn string, schema Schema) error {
	_, err := Upgrade(ctx, dsn, schema)
	return err
}

// Upgrade is Migrate, returning the file names of the migrations it
// applied, oldest first: none when the schema was already up to date.
func Upgrade(ctx context.Context, dsn string, schema Schema) ([]string, error) {
	return schema.set().upgrade(ctx, dsn)
}

// MigrateTo brings the schema up to version and no further, under the
// same lock as Migrate: a database as an older release left it, so tests
// can put rows in place the way that release wrote them before the rest
// of the migrations run.
func MigrateTo(ctx context.Context, dsn string, schema Schema, version int64) error {
	return schema.set().migrate(ctx, dsn, func(p *goose.Provider) error {
		_, err := p.UpTo(ctx, version)
		return err
	})
}

// Tables are a consumer's own tables, migrated from files the consumer
// keeps beside its code (the example consumers' projection_balances and
// audit_log), applied to the consumer database after the consumer schema.
// Each consumer's set has a version table of its own, named after its role
// (posthorn_consumer_<name>_migrations), and runs under the consumer
// schema's lock.
type Tables struct {
	// Consumer is the consumer the tables belong to.
	Consumer string
	// FS holds the set's goose SQL files (NNNNN_what.sql) in its folder
	// tables/, as a consumer package embeds them beside its code.
	FS fs.FS
}

// UpgradeTables is Upgrade for a consumer's own tables.
func UpgradeTables(ctx context.Context, dsn string, t Tables) ([]string, error) {
	set, err := t.set()
	if err != nil {
		return nil, err
	}
	return set.upgrade(ctx, dsn)
}

// CheckTables is CheckSchema for a consumer's own tables.
func CheckTables(ctx context.Context, db versionReader, t Tables) (SchemaStatus, error) {
	set, err := t.set()
	if err != nil {
		return SchemaStatus{}, err
	}
	return set.check(ctx, db)
}

func (t Tables) set() (migrationSet, error) {
	role, err := ConsumerRole(t.Consumer)
	if err != nil {
		return migrationSet{}, err
	}
	if t.FS == nil {
		return migrationSet{}, fmt.Errorf("the tables of %s: no migration files", t.Consumer)
	}
	sub, err := fs.Sub(t.FS, "tables")
	if err != nil {
		return migrationSet{}, fmt.Errorf("the tables of %s: %w", t.Consumer, err)
	}
	return migrationSet{name: "tables of " + t.Consumer, fsys: sub, table: string(role) + "_migrations",
		lock: lockID(ConsumerSchema)}, nil
}

// SchemaStatus is what CheckSchema found: whether the schema's version
// table exists, and the embedded migrations the database has not applied.
type SchemaStatus struct {
	Missing bool
	Pending []string
}

// Current reports a schema that is there with nothing pending.
func (s SchemaStatus) Current() bool { return !s.Missing && len(s.Pending) == 0 }

// versionReader is a pool or a connection: what reads a version table.
type versionReader interface {
	QueryRow(context.Context, string, ...any) pgx.Row
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// CheckSchema compares the database's version table of schema with the
// migrations embedded in this binary, so a command can stop at start with
// "run posthorn migrate" instead of failing later on a missing relation.
// A role that may not read the version table (the per-component roles
// may not) learns only whether the table exists: Pending is then empty.
func CheckSchema(ctx context.Context, db versionReader, schema Schema) (SchemaStatus, error) {
	return schema.set().check(ctx, db)
}

// migrationSet is one set of goose migrations: a schema's or a consumer's
// own tables.
type migrationSet struct {
	name  string // in errors: "ledger schema", "tables of audit-log"
	fsys  fs.FS
	table string // the goose version table
	lock  int64  // the session advisory lock a run holds
}

func (s Schema) set() migrationSet {
	sub, err := fs.Sub(migrations, "migrations/"+string(s))
	if err != nil { // only for a malformed path, which a Schema constant is not
		panic(err)
	}
	return migrationSet{name: string(s) + " schema", fsys: sub, table: versionTable(s), lock: lockID(s)}
}

func (m migrationSet) check(ctx context.Context, db versionReader) (SchemaStatus, error) {
	var present bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.table).Scan(&present); err != nil {
		return SchemaStatus{}, fmt.Errorf("check the %s: %w", m.name, err)
	}
	if !present {
		return SchemaStatus{Missing: true}, nil
	}
	rows, err := db.Query(ctx, `SELECT DISTINCT version_id FROM `+pgx.Identifier{m.table}.Sanitize()+` WHERE is_applied`)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			return SchemaStatus{}, nil
		}
		return SchemaStatus{}, fmt.Errorf("check the %s: %w", m.name, err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return SchemaStatus{}, nil
		}
		return SchemaStatus{}, fmt.Errorf("check the %s: %w", m.name, err)
	}
	done := make(map[int64]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	files, err := fs.ReadDir(m.fsys, ".")
	if err != nil {
		return SchemaStatus{}, fmt.Errorf("migrations for %s: %w", m.name, err)
	}
	var st SchemaStatus
	for _, f := range files {
		num, _, _ := strings.Cut(f.Name(), "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil || !strings.HasSuffix(f.Name(), ".sql") {
			continue
		}
		if !done[v] {
			st.Pending = append(st.Pending, f.Name())
		}
	}
	return st, nil
}

// upgrade applies every pending migration of m and names them.
func (m migrationSet) upgrade(ctx context.Context, dsn string) ([]string, error) {
	var applied []string
	err := m.migrate(ctx, dsn, func(p *goose.Provider) error {
		res, err := p.Up(ctx)
		for _, r := range res {
			if r.Error == nil {
				applied = append(applied, path.Base(r.Source.Path))
			}
		}
		return err
	})
	return applied, err
}

// versionTable is the goose version table of schema.
func versionTable(schema Schema) string { return "posthorn_" + string(schema) + "_migrations" }

// migrate opens dsn and runs step on a provider of m's migrations (under
// the advisory lock).
func (m migrationSet) migrate(ctx context.Context, dsn string, step func(*goose.Provider) error) error {
	cfg, err := ParseConfig(dsn)
	if err != nil {
		return err
	}
	db := stdlib.OpenDB(*cfg.ConnConfig)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(m.lock))
	if err != nil {
		return err
	}
	store, err := database.NewStore(database.DialectPostgres, m.table)
	if err != nil {
		return err
	}
	p, err := goose.NewProvider("", db, m.fsys,
		goose.WithStore(store),
		goose.WithSessionLocker(locker),
		goose.WithAllowOutofOrder(true),
	)
	if err != nil {
		return fmt.Errorf("migrations for %s: %w", m.name, err)
	}
	if err := step(p); err != nil {
		return fmt.Errorf("migrate %s: %w", m.name, err)
	}
	return nil
}

func lockID(s Schema) int64 {
	if s == ConsumerSchema {
		return 0x706f7374_0002
	}
	return 0x706f7374_0001
}
