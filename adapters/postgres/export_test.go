package postgres

import (
	"context"

	"github.com/pressly/goose/v3"
)

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
