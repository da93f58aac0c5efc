package projection

import "embed"

// Tables holds the migrations of the projection's own table,
// projection_balances, in its folder tables/: goose SQL files that `posthorn
// migrate --consumer` applies to the consumer database after the consumer
// schema.
//
//go:embed tables/*.sql
var Tables embed.FS
