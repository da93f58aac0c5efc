package relaystore

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/posthorn/posthorn/relay"
)

var _ relay.StandbyProbe = (*Store)(nil)

// standbyStatus reads the WAL insert position and the physical standbys in
// one statement. A WAL sender that streams a logical slot (the CDC relay,
// a logical subscriber) is not a standby: its flush position is what it
// confirmed of the decoded stream. A base backup's WAL sender has no flush
// position and counts as not flushed.
const standbyStatus = `
SELECT pg_current_wal_insert_lsn(), r.application_name, coalesce(r.state, ''), r.flush_lsn
FROM (SELECT 1) one
LEFT JOIN pg_stat_replication r ON r.pid NOT IN (
    SELECT active_pid FROM pg_replication_slots WHERE slot_type = 'logical' AND active_pid IS NOT NULL)`

// StandbyStatus reads the ledger's WAL insert position and its physical
// standbys with their flush positions (pg_stat_replication; the role needs
// pg_read_all_stats to see them, else they read as not flushed).
func (s *Store) StandbyStatus(ctx context.Context) (relay.StandbyStatus, error) {
	rows, err := s.pool.Query(ctx, standbyStatus)
	if err != nil {
		return relay.StandbyStatus{}, fmt.Errorf("read pg_stat_replication: %w", err)
	}
	defer rows.Close()
	var st relay.StandbyStatus
	for rows.Next() {
		var insert pglogrepl.LSN
		var name, state *string
		var flush *pglogrepl.LSN
		if err := rows.Scan(&insert, &name, &state, &flush); err != nil {
			return relay.StandbyStatus{}, fmt.Errorf("read pg_stat_replication: %w", err)
		}
		st.Insert = relay.LSN(insert)
		if name == nil {
			continue // the LEFT JOIN's row when there is no standby
		}
		sb := relay.Standby{Name: *name, State: *state}
		if flush != nil {
			sb.Flush = relay.LSN(*flush)
		}
		st.Standbys = append(st.Standbys, sb)
	}
	if err := rows.Err(); err != nil {
		return relay.StandbyStatus{}, fmt.Errorf("read pg_stat_replication: %w", err)
	}
	return st, nil
}

// ReplicationSettings returns synchronous_standby_names and whether this
// session can read the standbys' positions: a superuser, or a member of
// pg_read_all_stats (posthorn_relay is, see roles/cluster.sql).
func (s *Store) ReplicationSettings(ctx context.Context) (string, bool, error) {
	var names string
	var canRead bool
	err := s.pool.QueryRow(ctx, `
SELECT current_setting('synchronous_standby_names'),
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) OR pg_has_role('pg_read_all_stats', 'USAGE')`).Scan(&names, &canRead)
	if err != nil {
		return "", false, fmt.Errorf("read the replication settings: %w", err)
	}
	return names, canRead, nil
}
