package auditlog

import "embed"

// Tables holds the migrations of the audit log's own table,
// audit_log, in its folder tables/: goose SQL files that `posthorn
// migrate --consumer` applies to the consumer database after the consumer
// schema.
//
//go:embed tables/*.sql
var Tables embed.FS
