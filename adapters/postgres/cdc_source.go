package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// This file is the CDC relay's view of the ledger database: the slot's
// lease and fenced markers, slot and server checks, and a logical
// replication client (pgoutput over github.com/jackc/pglogrepl) that turns
// inserts into the outbox table into OutboxRows in commit order.

// LSN is a WAL position.
type LSN = pglogrepl.LSN

// HeartbeatPrefix is the prefix of the logical decoding messages the CDC
// relay emits on an idle database, so the slot has a position to confirm.
const HeartbeatPrefix = "posthorn.heartbeat"

// ErrCDCNotAvailable wraps the reasons the server cannot serve the CDC relay
// (wal_level, the REPLICATION attribute).
var ErrCDCNotAvailable = errors.New("CDC relay mode is not available on this server")

// CDCStore keeps the CDC relay's lease, markers and slot. Every method is
// one short statement and safe for concurrent use.
type CDCStore struct {
	pool *pgxpool.Pool
}

// NewCDCStore returns a store over pool.
func NewCDCStore(pool *pgxpool.Pool) *CDCStore { return &CDCStore{pool: pool} }

// CheckServer reports, wrapped in ErrCDCNotAvailable, why the server cannot
// stream the outbox: wal_level is not logical, or the role has neither
// REPLICATION nor superuser.
func (s *CDCStore) CheckServer(ctx context.Context) error {
	var level, role string
	var repl bool
	err := s.pool.QueryRow(ctx, `
SELECT current_setting('wal_level'), current_user, rolreplication OR rolsuper
FROM pg_roles WHERE rolname = current_user`).Scan(&level, &role, &repl)
	if err != nil {
		return fmt.Errorf("check server for CDC: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w: wal_level is %q, want logical (set wal_level = logical in postgresql.conf and restart PostgreSQL, or use relay.mode polling)", ErrCDCNotAvailable, level)
	}
	if !repl {
		return fmt.Errorf("%w: role %q lacks the REPLICATION attribute (ALTER ROLE %s REPLICATION)", ErrCDCNotAvailable, role, pgx.Identifier{role}.Sanitize())
	}
	return nil
}

// EnsurePublication creates publication (inserts into the outbox table
// only) unless it exists. Creating it needs ownership of the outbox table;
// a least-privilege deployment creates it in advance.
func (s *CDCStore) EnsurePublication(ctx context.Context, publication string) error {
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

// CDCLease is a held slot lease; Token is the fencing token of this grant.
type CDCLease struct {
	Slot  string
	Token int64
	// PreviousOwner is set when the lease was taken over from another relay
	// whose lease had expired.
	PreviousOwner string
	// SlotCreatedAt is when a relay last created the slot (zero: never).
	SlotCreatedAt time.Time
}

// AcquireCDCLease takes slot's lease for owner if it is free, expired, or
// already owner's, with a new fencing token. ok is false when another relay
// holds it.
func (s *CDCStore) AcquireCDCLease(ctx context.Context, slot, owner string, ttl time.Duration) (l CDCLease, ok bool, err error) {
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

// RenewCDCLease extends the lease if owner still holds it under the same
// token; false means it was lost.
func (s *CDCStore) RenewCDCLease(ctx context.Context, l CDCLease, owner string, ttl time.Duration) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
UPDATE relay_cdc_leases SET expires_at = now() + $4::interval
WHERE slot = $1 AND token = $2 AND owner = $3`, l.Slot, l.Token, owner, ttl)
	if err != nil {
		return false, fmt.Errorf("renew CDC lease: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseCDCLease frees the lease if owner still holds it.
func (s *CDCStore) ReleaseCDCLease(ctx context.Context, l CDCLease, owner string) error {
	_, err := s.pool.Exec(ctx, `
UPDATE relay_cdc_leases SET owner = NULL, expires_at = '-infinity'
WHERE slot = $1 AND token = $2 AND owner = $3`, l.Slot, l.Token, owner)
	if err != nil {
		return fmt.Errorf("release CDC lease: %w", err)
	}
	return nil
}

// MarkRelayedCDC writes the marker of rows ids (ACKed by the sink): it
// deletes their pending rows if l is still the slot's current grant; the
// lease row is share-locked for the statement, so a takeover either waits
// for the marker or the marker sees the new token. fenced is true when the
// lease was lost and nothing was marked. Rows already marked are left as
// they are.
//
// invisible lists the ids this statement could not see at all. Logical
// decoding may hand over a transaction as soon as its commit record is
// flushed, a moment before the committing session leaves the proc array
// and its rows become visible to other snapshots; the caller retries those
// ids shortly instead of confirming past unmarked rows.
func (s *CDCStore) MarkRelayedCDC(ctx context.Context, ids []int64, l CDCLease) (marked int, invisible []int64, fenced bool, err error) {
	if len(ids) == 0 {
		return 0, nil, false, nil
	}
	var held int
	// The outbox rows give each id its shard (the queue's key) and tell the
	// visible ids from the invisible ones.
	err = s.pool.QueryRow(ctx, `
WITH held AS (
    SELECT token FROM relay_cdc_leases WHERE slot = $2 AND token = $3 FOR SHARE
), seen AS (
    SELECT o.id, o.shard FROM outbox o WHERE o.id = ANY($1::bigint[])
), del AS (
    DELETE FROM outbox_pending p USING seen
    WHERE p.shard = seen.shard AND p.id = seen.id AND EXISTS (SELECT 1 FROM held)
    RETURNING p.id
)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM del),
       ARRAY(SELECT x FROM unnest($1::bigint[]) AS x WHERE x NOT IN (SELECT id FROM seen))`,
		ids, l.Slot, l.Token).Scan(&held, &marked, &invisible)
	if err != nil {
		return 0, nil, false, fmt.Errorf("write relay markers: %w", err)
	}
	if held == 0 {
		return 0, nil, true, nil
	}
	return marked, invisible, false, nil
}

// Marked returns which of ids already carry a marker (are visible and no
// longer pending).
func (s *CDCStore) Marked(ctx context.Context, ids []int64) (map[int64]bool, error) {
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

// SlotStatus is a replication slot as pg_replication_slots shows it, plus
// the WAL it holds back. Fields are added, never renamed (scripts read the
// JSON of `posthorn outbox status`).
type SlotStatus struct {
	Slot   string `json:"slot"`
	Exists bool   `json:"exists"`
	Active bool   `json:"active"`
	// ActivePID is the WAL sender streaming the slot (0: none).
	ActivePID int `json:"active_pid,omitempty"`
	// WALStatus is reserved, extended, unreserved or lost (lost: the server
	// removed WAL the slot needed; it can never stream again).
	WALStatus string `json:"wal_status"`
	// SafeWALSize is how many more bytes of WAL can be written before the
	// slot is in danger of being lost (NULL in PostgreSQL when
	// max_slot_wal_keep_size is -1, i.e. unlimited: then nil).
	SafeWALSize *int64 `json:"safe_wal_size_bytes"`
	// RetainedBytes is pg_current_wal_lsn() - restart_lsn: the WAL the slot
	// keeps on disk.
	RetainedBytes int64 `json:"retained_bytes"`
	// UnconfirmedBytes is pg_current_wal_lsn() - confirmed_flush_lsn.
	UnconfirmedBytes  int64  `json:"unconfirmed_bytes"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn,omitempty"`
	// FlushLagSeconds is the WAL sender's flush_lag (pg_stat_replication):
	// how long recent WAL took to be confirmed; nil when idle or inactive.
	FlushLagSeconds *float64 `json:"flush_lag_seconds,omitempty"`
	// MaxSlotWALKeepSize is the server's max_slot_wal_keep_size setting.
	MaxSlotWALKeepSize string `json:"max_slot_wal_keep_size"`
}

// SlotStatus reads slot's state; Exists is false when there is no such slot.
func (s *CDCStore) SlotStatus(ctx context.Context, slot string) (SlotStatus, error) {
	st := SlotStatus{Slot: slot}
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
func (s *CDCStore) CreateSlot(ctx context.Context, slot string) (LSN, error) {
	var lsn LSN
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
		return lsn, fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		var pending int
		err := s.pool.QueryRow(ctx, `
SELECT count(*) FROM pg_snapshot_xip($1::pg_snapshot) AS x
WHERE pg_xact_status(x) = 'committed' AND NOT pg_visible_in_snapshot(x, pg_current_snapshot())`, snap).Scan(&pending)
		if err != nil {
			return lsn, fmt.Errorf("create replication slot %s: %w", slot, err)
		}
		if pending == 0 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return lsn, ctx.Err()
		}
	}
	if _, err := s.pool.Exec(ctx, `UPDATE relay_cdc_leases SET slot_created_at = now(), slot_created_lsn = $2::text::pg_lsn WHERE slot = $1`, slot, lsn.String()); err != nil {
		return lsn, fmt.Errorf("record slot %s: %w", slot, err)
	}
	return lsn, nil
}

// DropSlot drops slot if it exists and is not streaming.
func (s *CDCStore) DropSlot(ctx context.Context, slot string) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
	if err != nil {
		return fmt.Errorf("drop replication slot %s: %w", slot, err)
	}
	return nil
}

// TerminateReader ends the WAL sender streaming slot (a stalled previous
// lease holder's) so the new holder can stream it. It needs superuser or
// membership in pg_signal_backend.
func (s *CDCStore) TerminateReader(ctx context.Context, slot string) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
	if err != nil {
		return fmt.Errorf("end the previous reader of slot %s: %w", slot, err)
	}
	return nil
}

// EmitHeartbeat writes a tiny non-transactional logical decoding message,
// so an idle slot has a position past the WAL others generated to confirm.
func (s *CDCStore) EmitHeartbeat(ctx context.Context) (LSN, error) {
	var lsn LSN
	err := s.pool.QueryRow(ctx, `SELECT pg_logical_emit_message(false, $1, '')`, HeartbeatPrefix).Scan(&lsn)
	if err != nil {
		return 0, fmt.Errorf("emit heartbeat: %w", err)
	}
	return lsn, nil
}

// OutboxMaxID is the largest id of a visible outbox row (0 when empty). Read
// after a slot is created, it bounds what the catch-up must cover: a row
// with a larger id was inserted, hence committed, after the slot's
// consistent point, so the stream carries it.
func (s *CDCStore) OutboxMaxID(ctx context.Context) (int64, error) {
	var id int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&id); err != nil {
		return 0, fmt.Errorf("outbox max id: %w", err)
	}
	return id, nil
}

// CurrentWALLSN is pg_current_wal_lsn().
func (s *CDCStore) CurrentWALLSN(ctx context.Context) (LSN, error) {
	var lsn LSN
	if err := s.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&lsn); err != nil {
		return 0, fmt.Errorf("current WAL position: %w", err)
	}
	return lsn, nil
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

// IsSlotInUse reports whether err says another WAL sender streams the slot.
func IsSlotInUse(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55006"
}

// StreamEventKind tells what a StreamEvent carries.
type StreamEventKind int

const (
	// EventNone: nothing arrived before the deadline.
	EventNone StreamEventKind = iota
	// EventBegin starts a transaction.
	EventBegin
	// EventRow is one row inserted into the outbox by the open transaction.
	EventRow
	// EventCommit ends the open transaction; LSN is its end: confirming it
	// tells the server the whole transaction is handled.
	EventCommit
	// EventHeartbeat is a heartbeat message outside any transaction; LSN is
	// its position.
	EventHeartbeat
	// EventKeepalive is the server's keepalive; LSN is the WAL end it has
	// sent up to: every transaction committed before it was already sent.
	EventKeepalive
)

// StreamEvent is one decoded item of the replication stream.
type StreamEvent struct {
	Kind StreamEventKind
	LSN  LSN
	// CommitTime is the commit time of the transaction (Begin, Commit).
	CommitTime time.Time
	Row        OutboxRow
	// ReplyRequested is set on a keepalive that asks for a status update
	// now.
	ReplyRequested bool
}

// CDCStream is one replication connection streaming the outbox. It is not
// safe for concurrent use: one goroutine reads and confirms.
type CDCStream struct {
	conn      *pgconn.PgConn
	relations map[uint32]*pglogrepl.RelationMessage
	types     *pgtype.Map
	pending   []StreamEvent
}

// OpenStream opens a replication connection (replication=database) with
// the connection settings of pool and starts streaming slot through
// publication from the slot's confirmed position: the server sends only
// transactions that commit after it.
func OpenStream(ctx context.Context, pool *pgxpool.Pool, slot, publication string) (*CDCStream, error) {
	cfg := pool.Config().ConnConfig.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = RelayApplicationName
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, pgx.Identifier{slot}.Sanitize(), 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names " + quoteLiteral(publication),
			"messages 'true'",
		},
	})
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("start replication of slot %s: %w", slot, err)
	}
	return &CDCStream{conn: conn, relations: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap()}, nil
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// Close ends the stream and its connection.
func (c *CDCStream) Close(ctx context.Context) error { return c.conn.Close(ctx) }

// BackendPID is the WAL sender's process ID.
func (c *CDCStream) BackendPID() uint32 { return c.conn.PID() }

// Confirm tells the server that everything up to lsn is handled: the slot
// may release WAL before it and a restart resumes after it.
func (c *CDCStream) Confirm(ctx context.Context, lsn LSN) error {
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, c.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn}); err != nil {
		return fmt.Errorf("confirm WAL position %s: %w", lsn, err)
	}
	return nil
}

// Next returns the next stream event, or an EventNone event when nothing
// arrives before deadline. Any error ends the stream (close it).
func (c *CDCStream) Next(ctx context.Context, deadline time.Time) (StreamEvent, error) {
	for len(c.pending) == 0 {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := c.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				return StreamEvent{}, nil
			}
			return StreamEvent{}, fmt.Errorf("replication stream: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return StreamEvent{}, fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			if err := c.decode(msg.Data); err != nil {
				return StreamEvent{}, err
			}
		case *pgproto3.CopyDone:
			return StreamEvent{}, errors.New("replication stream: the server ended it")
		}
	}
	ev := c.pending[0]
	c.pending = c.pending[1:]
	return ev, nil
}

func (c *CDCStream) decode(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("replication stream: %w", err)
		}
		c.pending = append(c.pending, StreamEvent{Kind: EventKeepalive, LSN: pkm.ServerWALEnd, ReplyRequested: pkm.ReplyRequested})
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("replication stream: %w", err)
		}
		msg, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("replication stream: decode pgoutput: %w", err)
		}
		switch m := msg.(type) {
		case *pglogrepl.RelationMessage:
			c.relations[m.RelationID] = m
		case *pglogrepl.BeginMessage:
			c.pending = append(c.pending, StreamEvent{Kind: EventBegin, LSN: m.FinalLSN, CommitTime: m.CommitTime})
		case *pglogrepl.CommitMessage:
			c.pending = append(c.pending, StreamEvent{Kind: EventCommit, LSN: m.TransactionEndLSN, CommitTime: m.CommitTime})
		case *pglogrepl.InsertMessage:
			rel, ok := c.relations[m.RelationID]
			if !ok {
				return fmt.Errorf("replication stream: insert into unknown relation %d", m.RelationID)
			}
			if rel.RelationName != "outbox" {
				return nil // the publication should hold only the outbox
			}
			row, err := c.decodeRow(rel, m.Tuple)
			if err != nil {
				return err
			}
			c.pending = append(c.pending, StreamEvent{Kind: EventRow, LSN: xld.WALStart, Row: row})
		case *pglogrepl.LogicalDecodingMessage:
			if !m.Transactional && m.Prefix == HeartbeatPrefix {
				c.pending = append(c.pending, StreamEvent{Kind: EventHeartbeat, LSN: m.LSN})
			}
		}
	}
	return nil
}

// decodeRow turns a pgoutput tuple (text format) into an OutboxRow, the
// same values ReadBatch reads.
func (c *CDCStream) decodeRow(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (OutboxRow, error) {
	var (
		r       OutboxRow
		e       = &r.Envelope
		kind    string
		headers string
	)
	if tuple == nil || len(tuple.Columns) != len(rel.Columns) {
		return r, errors.New("replication stream: outbox tuple does not match its relation")
	}
	for i, col := range tuple.Columns {
		rc := rel.Columns[i]
		if col.DataType == pglogrepl.TupleDataTypeNull {
			continue
		}
		if col.DataType != pglogrepl.TupleDataTypeText {
			return r, fmt.Errorf("replication stream: outbox column %s is not in text format", rc.Name)
		}
		var dst any
		switch rc.Name {
		case "id":
			dst = &r.ID
		case "shard":
			dst = &r.Shard
		case "event_id":
			dst = &e.EventID
		case "kind":
			dst = &kind
		case "type":
			dst = &e.Type
		case "topic":
			dst = &e.Topic
		case "aggregate_type":
			dst = &e.AggregateType
		case "aggregate_id":
			dst = &e.AggregateID
		case "revision":
			dst = &e.Revision
		case "journal_id":
			dst = &e.JournalID
		case "headers":
			dst = &headers
		case "payload":
			dst = &e.Payload
		case "occurred_at":
			dst = &e.OccurredAt
		default:
			continue
		}
		if err := c.scan(rc.DataType, col.Data, dst); err != nil {
			return r, fmt.Errorf("replication stream: outbox column %s: %w", rc.Name, err)
		}
	}
	e.Kind = core.Kind(kind)
	if headers != "" && headers != "{}" {
		if err := json.Unmarshal([]byte(headers), &e.Headers); err != nil {
			return r, fmt.Errorf("outbox row %d: headers: %w", r.ID, err)
		}
	}
	if e.Headers != nil && e.Headers[core.HeaderReplay] == "true" {
		e.Replay = true
	}
	return r, nil
}

func (c *CDCStream) scan(oid uint32, data []byte, dst any) error {
	switch d := dst.(type) {
	case *string:
		// uuid, text and jsonb arrive as their text form.
		*d = string(data)
		return nil
	case *int64:
		v, err := strconv.ParseInt(string(data), 10, 64)
		*d = v
		return err
	case *int:
		v, err := strconv.Atoi(string(data))
		*d = v
		return err
	}
	return c.types.Scan(oid, pgtype.TextFormatCode, data, dst)
}
