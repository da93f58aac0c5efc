package relaystore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/core"
)

// horizonQuery finds what holds the ledger database's MVCC horizon back the
// furthest: a session of this database with a snapshot or a transaction ID
// (backend_xmin), a prepared transaction of it, a replication slot's xmin
// (a physical slot fed by hot_standby_feedback; a logical slot, the CDC
// relay's included, holds only catalog_xmin, which pins the system
// catalogs and never a table's rows), or a standby's feedback through its
// WAL sender. The relay's own sessions (application name
// postgres.RelayApplicationName) take snapshots for a statement at a time
// and are left out. Other roles' sessions show their backend_xmin only to
// a role with pg_read_all_stats (posthorn migrate --roles grants it to
// posthorn_relay).
const horizonQuery = `
SELECT kind, holder, state, xid_age, xmin::text::bigint, secs FROM (
    SELECT 'session' AS kind, coalesce(nullif(application_name, ''), usename::text, '?') || ' (pid ' || pid || ')' AS holder,
           coalesce(state, '') AS state, age(backend_xmin)::bigint AS xid_age, backend_xmin AS xmin,
           extract(epoch FROM now() - coalesce(xact_start, query_start, backend_start))::float8 AS secs
    FROM pg_stat_activity
    WHERE datname = current_database() AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
      AND application_name <> $1
    UNION ALL
    SELECT 'prepared', gid, '', age(transaction)::bigint, transaction, extract(epoch FROM now() - prepared)::float8
    FROM pg_prepared_xacts WHERE database = current_database()
    UNION ALL
    SELECT 'slot', slot_name::text, '', age(xmin)::bigint, xmin, NULL
    FROM pg_replication_slots WHERE xmin IS NOT NULL AND (database IS NULL OR database = current_database())
    UNION ALL
    SELECT 'standby', coalesce(nullif(application_name, ''), '?') || ' (pid ' || pid || ')', '', age(backend_xmin)::bigint, backend_xmin, NULL
    FROM pg_stat_replication WHERE backend_xmin IS NOT NULL
) h
ORDER BY xid_age DESC, kind
LIMIT 1`

// Horizon reads what holds the ledger database's MVCC horizon back the
// furthest; the zero value when nothing but short statements does. A
// slot's or a standby's AgeSeconds is -1 here: the server does not say
// since when, and the caller that reads it over time knows better.
func (s *Store) Horizon(ctx context.Context) (core.LedgerHorizon, error) {
	var h core.LedgerHorizon
	var secs pgtype.Float8
	err := s.pool.QueryRow(ctx, horizonQuery, postgres.RelayApplicationName).
		Scan(&h.Kind, &h.Holder, &h.State, &h.XIDAge, &h.Xmin, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.LedgerHorizon{}, nil
	}
	if err != nil {
		return core.LedgerHorizon{}, fmt.Errorf("ledger horizon: %w", err)
	}
	h.AgeSeconds = -1
	if secs.Valid {
		h.AgeSeconds = max(secs.Float64, 0)
	}
	return h, nil
}
