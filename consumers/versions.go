package consumers

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/core"
)

// Versions is a handler per payload schema version (header
// schema_version), for a consumer that reads an event type whose payload
// changed: register Versions{1: v1, 2: v2}.Handler() as the handler, and
// events of either version are applied by the matching one, in order, with
// the inbox around both. An event of a version without a handler is a
// permanent failure (parked as poison, naming the version), never applied
// by the wrong handler: deploy the handler before its writers.
type Versions map[int]Handler

// Handler returns the handler that dispatches on the event's version.
func (v Versions) Handler() Handler {
	return func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		h, ok := v[e.SchemaVersion]
		if !ok {
			return Permanent(fmt.Errorf("%s %s: no handler for schema version %d of %s", e.AggregateType, e.EventID, e.SchemaVersion, e.Type))
		}
		return h(ctx, tx, e)
	}
}
