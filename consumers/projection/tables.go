package projection

import (
	"embed"
	"io/fs"
)

//go:embed tables/*.sql
var tables embed.FS

// Tables returns the migrations of the projection's own table,
// projection_balances: goose SQL files that `posthorn migrate --consumer`
// applies to the consumer database after the consumer schema.
func Tables() fs.FS {
	sub, _ := fs.Sub(tables, "tables") // fails only on a malformed path
	return sub
}
