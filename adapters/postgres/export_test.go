package postgres

import (
	"context"

	"github.com/pressly/goose/v3"
)

// ScramVerifierForTest exposes scramVerifier with a given salt, so a test
// can compare it with the verifier PostgreSQL computes.
var ScramVerifierForTest = scramVerifier

// MigrateDownTo takes the schema down to version: an operator's rollback
// to an earlier release.
func MigrateDownTo(ctx context.Context, dsn string, schema Schema, version int64) error {
	return schema.set().migrate(ctx, dsn, func(p *goose.Provider) error {
		_, err := p.DownTo(ctx, version)
		return err
	})
}
