package cdcsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/cdc"
)

// This file is the CDC relay's view of the ledger database (cdc.Source):
// the slot's lease and fenced markers, slot and server checks; the
// replication client itself is in cdc_stream.go.

// HeartbeatPrefix is the prefix of the logical decoding messages the CDC
// relay emits on an idle database, so the slot has a position to confirm.
const HeartbeatPrefix = "posthorn.heartbeat"

// RelayedPrefix is the prefix of the transactional logical decoding
// message a transaction emits before it inserts outbox rows already marked
// relayed (posthorn.failover_rebuild, migration 00015): the stream says so
// (cdc.EventRelayedRows), and the relay checks those rows' markers instead
// of sending them as new.
const RelayedPrefix = "posthorn.relayed"

// Source keeps the CDC relay's lease, markers and slot. Every method is
// one short statement and safe for concurrent use.
type Source struct {
	pool *pgxpool.Pool
}

// New returns a source over pool.
func New(pool *pgxpool.Pool) *Source { return &Source{pool: pool} }

// CheckServer reports, wrapped in cdc.ErrNotAvailable, why the server cannot
// stream the outbox: wal_level is not logical, or the role has neither
// REPLICATION nor superuser.
func (s *Source) CheckServer(ctx context.Context) error {
	var level, role string
	var repl bool
	err := s.pool.QueryRow(ctx, `
SELECT current_setting('wal_level'), current_user, rolreplication OR rolsuper
FROM pg_roles WHERE rolname = current_user`).Scan(&level, &role, &repl)
	if err != nil {
		return fmt.Errorf("check server for CDC: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w: wal_level is %q, want logical (set wal_level = logical in postgresql.conf and restart PostgreSQL, or use relay.mode polling)", cdc.ErrNotAvailable, level)
	}
	if !repl {
		return fmt.Errorf("%w: role %q lacks the REPLICATION attribute (ALTER ROLE %s REPLICATION)", cdc.ErrNotAvailable, role, pgx.Identifier{role}.Sanitize())
	}
	return nil
}

// EnsurePublication creates publication (inserts into the outbox table
// only) unless it exists. Creating it needs ownership of the outbox table;
// a least-privilege deployment creates it in advance.
func (s *Source) EnsurePublication(ctx context.Context, publication string) error {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, publication).Scan(&exists); err != nil {
		return fmt.Errorf("publication %s: %w", publication, err)
	}
	if exists {
		return nil
	}
	_, err := s.pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{publication}.Sanitize()+` FOR TABLE outbox WITH (publish = 'insert')`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
		return nil
	}
	if err != nil {
		return fmt.Errorf("create publication %s: %w", publication, err)
	}
	return nil
}

// AcquireLease takes slot's lease for owner if it is free, expired, or
// already owner's, with a new fencing token. ok is false when another relay
// holds it.
func (s *Source) AcquireLease(ctx context.Context, slot, owner string, ttl time.Duration) (l cdc.Lease, ok bool, err error) {
	if _, err := s.pool.Exec(ctx, `INSERT INTO relay_cdc_leases (slot) VALUES ($1) ON CONFLICT DO NOTHING`, slot); err != nil {
		return l, false, fmt.Errorf("acquire CDC lease: %w", err)
	}
	var created pgtype.Timestamptz
	err = s.pool.QueryRow(ctx, `
WITH pick AS (
    SELECT slot, owner AS prev FROM relay_cdc_leases
    WHERE slot = $1 AND (owner IS NULL OR expires_at < now() OR owner = $2)
    FOR UPDATE SKIP LOCKED
)
UPDATE relay_cdc_leases l
SET owner = $2, token = nextval('relay_fencing_token'), expires_at = now() + $3::interval
FROM pick WHERE l.slot = pick.slot
RETURNING l.token, coalesce(pick.prev, ''), l.slot_created_at`, slot, owner, ttl).Scan(&l.Token, &l.PreviousOwner, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	if err != nil {
		return l, false, fmt.Errorf("acquire CDC lease: %w", err)
	}
	l.Slot = slot
	if l.PreviousOwner == owner {
		l.PreviousOwner = ""
	}
	if created.Valid {
		l.SlotCreatedAt = created.Time
	}
	return l, true, nil
}

// RenewLease extends the lease if owner still holds it under the same
// token; false means it was lost.
func (s *Source) RenewLease(ctx context.Context, l cdc.Lease, owner string, ttl time.Duration) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
UPDATE relay_cdc_leases SET expires_at = now() + $4::interval
WHERE slot = $1 AND token = $2 AND owner = $3`, l.Slot, l.Token, owner, ttl)
	if err != nil {
		return false, fmt.Errorf("renew CDC lease: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseLease frees the lease if owner still holds it.
func (s *Source) ReleaseLease(ctx context.Context, l cdc.Lease, owner string) error {
	_, err := s.pool.Exec(ctx, `
UPDATE relay_cdc_leases SET owner = NULL, expires_at = '-infinity'
WHERE slot = $1 AND token = $2 AND owner = $3`, l.Slot, l.Token, owner)
	if err != nil {
		return fmt.Errorf("release CDC lease: %w", err)
	}
	return nil
}

// MarkRelayed writes the marker of the rows refs (ACKed by the sink): it
// deletes their pending rows if l is still the slot's current grant; the
// lease row is share-locked for the statement, so a takeover either waits
// for the marker or the marker sees the new token. fenced is true when the
// lease was lost and nothing was marked. Rows already marked are left as
// they are.
//
// invisible lists the rows this statement could not see at all. Logical
// decoding may hand over a transaction as soon as its commit record is
// flushed, a moment before the committing session leaves the proc array
// and its rows become visible to other snapshots; the caller retries those
// rows shortly instead of confirming past unmarked rows.
func (s *Source) MarkRelayed(ctx context.Context, refs []core.RowRef, l cdc.Lease) (marked int, invisible []core.RowRef, fenced bool, err error) {
	if len(refs) == 0 {
		return 0, nil, false, nil
	}
	ids := make([]int64, len(refs))
	shards := make([]int32, len(refs))
	for i, r := range refs {
		ids[i], shards[i] = r.ID, int32(r.Shard)
	}
	var held int
	var unseen []int64
	// One round trip: the setting holds for the marker's transaction only.
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(markSettings)
	b.Queue(markRelayed, ids, shards, l.Slot, l.Token).QueryRow(func(row pgx.Row) error {
		return row.Scan(&held, &marked, &unseen)
	})
	b.Queue("COMMIT")
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return 0, nil, false, fmt.Errorf("write relay markers: %w", err)
	}
	if held == 0 {
		return 0, nil, true, nil
	}
	if len(unseen) > 0 {
		byID := make(map[int64]core.RowRef, len(refs))
		for _, r := range refs {
			byID[r.ID] = r
		}
		for _, id := range unseen {
			invisible = append(invisible, byID[id])
		}
	}
	return marked, invisible, false, nil
}

// markRelayed deletes the pending entries of the rows ($1 ids, $2 their
// shards) if the slot's lease ($3) still carries the token $4,
// share-locking it, and returns whether it did, how many it deleted and
// which of the ids that found no pending entry have no visible outbox row
// either (invisible: retry) rather than being marked already; a pending
// entry is inserted with its outbox row, so the two are visible together.
// Each entry is found by its own probe of the queue's primary key, behind
// OFFSET 0 so that the planner cannot turn the probes into a scan of the
// queue, and deleted by its tuple ID (see relaystore's markRelayed: a plain
// join, planned while the queue looked nearly empty, scanned the whole
// queue per id, and under a long snapshot the queue holds every deleted
// entry). Only the ids that found no entry are looked up in the outbox.
const markRelayed = `
WITH held AS (
    SELECT token FROM relay_cdc_leases WHERE slot = $3 AND token = $4 FOR SHARE
), del AS (
    DELETE FROM outbox_pending
    WHERE EXISTS (SELECT 1 FROM held) AND ctid = ANY (ARRAY(
        SELECT q.ctid FROM unnest($1::bigint[], $2::int[]) AS m(id, shard)
        CROSS JOIN LATERAL (SELECT p.ctid FROM outbox_pending p WHERE p.shard = m.shard AND p.id = m.id OFFSET 0) q))
    RETURNING id
), rest AS (
    SELECT x FROM unnest($1::bigint[]) AS x WHERE x NOT IN (SELECT id FROM del)
)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM del),
       ARRAY(SELECT x FROM rest WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = rest.x))`

// markSettings price a sequential scan of the queue out of the marker's
// probes, for its transaction only.
const markSettings = `SELECT set_config('enable_seqscan', 'off', true)`

// Marked returns which of ids already carry a marker (are visible and no
// longer pending).
func (s *Source) Marked(ctx context.Context, ids []int64) (map[int64]bool, error) {
	rows, err := s.pool.Query(ctx, `
SELECT o.id FROM outbox o
WHERE o.id = ANY($1::bigint[])
  AND NOT EXISTS (SELECT 1 FROM outbox_pending p WHERE p.shard = o.shard AND p.id = o.id)`, ids)
	if err != nil {
		return nil, fmt.Errorf("read markers: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read markers: %w", err)
	}
	out := make(map[int64]bool, len(got))
	for _, id := range got {
		out[id] = true
	}
	return out, nil
}

// SlotStatus reads slot's state; Exists is false when there is no such slot.
func (s *Source) SlotStatus(ctx context.Context, slot string) (cdc.SlotStatus, error) {
	st := cdc.SlotStatus{Slot: slot}
	var (
		pid       pgtype.Int4
		walStatus pgtype.Text
		retained  pgtype.Int8
		unconf    pgtype.Int8
		confirmed pgtype.Text
	)
	err := s.pool.QueryRow(ctx, `
SELECT s.active, s.active_pid, s.wal_status, s.safe_wal_size,
       (pg_current_wal_lsn() - s.restart_lsn)::bigint,
       (pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint,
       s.confirmed_flush_lsn::text,
       extract(epoch FROM r.flush_lag)::float8,
       current_setting('max_slot_wal_keep_size')
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = $1`, slot).Scan(&st.Active, &pid, &walStatus, &st.SafeWALSize, &retained, &unconf,
		&confirmed, &st.FlushLagSeconds, &st.MaxSlotWALKeepSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("slot %s status: %w", slot, err)
	}
	st.Exists = true
	st.ActivePID = int(pid.Int32)
	st.WALStatus = walStatus.String
	st.RetainedBytes = retained.Int64
	st.UnconfirmedBytes = unconf.Int64
	st.ConfirmedFlushLSN = confirmed.String
	return st, nil
}

// CreateSlot creates slot with the pgoutput plugin and returns its
// consistent point: the stream starts with the first transaction that
// commits after it, and every transaction that committed before it is
// visible to any snapshot taken after this call returns. It records the
// creation in the slot's lease row.
func (s *Source) CreateSlot(ctx context.Context, slot string) (cdc.LSN, error) {
	var lsn pglogrepl.LSN
	if err := s.pool.QueryRow(ctx, `SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')`, slot).Scan(&lsn); err != nil {
		return 0, fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	// A transaction whose commit record precedes the consistent point is not
	// streamed, and may still be leaving the proc array (committed, not yet
	// visible to other snapshots) for a moment. Wait until every transaction
	// that is committed but still in progress in a snapshot taken now is
	// visible, so the caller's outbox read sees all of them.
	var snap string
	if err := s.pool.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap); err != nil {
		return cdc.LSN(lsn), fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		var pending int
		err := s.pool.QueryRow(ctx, `
SELECT count(*) FROM pg_snapshot_xip($1::pg_snapshot) AS x
WHERE pg_xact_status(x) = 'committed' AND NOT pg_visible_in_snapshot(x, pg_current_snapshot())`, snap).Scan(&pending)
		if err != nil {
			return cdc.LSN(lsn), fmt.Errorf("create replication slot %s: %w", slot, err)
		}
		if pending == 0 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return cdc.LSN(lsn), ctx.Err()
		}
	}
	if _, err := s.pool.Exec(ctx, `UPDATE relay_cdc_leases SET slot_created_at = now(), slot_created_lsn = $2::text::pg_lsn WHERE slot = $1`, slot, lsn.String()); err != nil {
		return cdc.LSN(lsn), fmt.Errorf("record slot %s: %w", slot, err)
	}
	return cdc.LSN(lsn), nil
}

// DropSlot drops slot if it exists and is not streaming.
func (s *Source) DropSlot(ctx context.Context, slot string) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
	if err != nil {
		return fmt.Errorf("drop replication slot %s: %w", slot, err)
	}
	return nil
}

// TerminateReader ends the WAL sender streaming slot (a stalled previous
// lease holder's) so the new holder can stream it. It needs superuser or
// membership in pg_signal_backend.
func (s *Source) TerminateReader(ctx context.Context, slot string) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
	if err != nil {
		return fmt.Errorf("end the previous reader of slot %s: %w", slot, err)
	}
	return nil
}

// EmitHeartbeat writes a tiny non-transactional logical decoding message,
// so an idle slot has a position past the WAL others generated to confirm.
func (s *Source) EmitHeartbeat(ctx context.Context) (cdc.LSN, error) {
	var lsn pglogrepl.LSN
	err := s.pool.QueryRow(ctx, `SELECT pg_logical_emit_message(false, $1, '')`, HeartbeatPrefix).Scan(&lsn)
	if err != nil {
		return 0, fmt.Errorf("emit heartbeat: %w", err)
	}
	return cdc.LSN(lsn), nil
}

// OutboxMaxID is the largest id of a visible outbox row (0 when empty). Read
// after a slot is created, it bounds what the catch-up must cover: a row
// with a larger id was inserted, hence committed, after the slot's
// consistent point, so the stream carries it.
func (s *Source) OutboxMaxID(ctx context.Context) (int64, error) {
	var id int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&id); err != nil {
		return 0, fmt.Errorf("outbox max id: %w", err)
	}
	return id, nil
}

// CurrentWALLSN is pg_current_wal_insert_lsn(): the end of every WAL record
// inserted so far. Not pg_current_wal_lsn(), the write position: with
// synchronous_commit off a transaction is visible once its commit record is
// inserted, before it is written, so a write position read after the
// outbox read that saw its rows can lie before its commit, and the stream
// would send those rows again as unmarked.
func (s *Source) CurrentWALLSN(ctx context.Context) (cdc.LSN, error) {
	var lsn pglogrepl.LSN
	if err := s.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&lsn); err != nil {
		return 0, fmt.Errorf("current WAL position: %w", err)
	}
	return cdc.LSN(lsn), nil
}

// IsSlotGone reports whether err from starting or reading the stream means
// the slot is missing (dropped) or can no longer stream (invalidated).
func IsSlotGone(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	// 42704 undefined_object: no such slot; 55000
	// object_not_in_prerequisite_state: "can no longer get changes from
	// replication slot" (invalidated).
	return pgErr.Code == "42704" || pgErr.Code == "55000"
}

// OpenStream is OpenStream over the source's connection settings, with an
// error wrapping cdc.ErrSlotInUse when another WAL sender streams slot.
func (s *Source) OpenStream(ctx context.Context, slot, publication string) (cdc.Stream, error) {
	st, err := OpenStream(ctx, s.pool, slot, publication)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55006" {
		return nil, fmt.Errorf("%w: %w", cdc.ErrSlotInUse, err)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

var _ cdc.Source = (*Source)(nil)
