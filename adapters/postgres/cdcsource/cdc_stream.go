package cdcsource

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/internal/outboxrow"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/cdc"
)

// This file is the CDC relay's replication client: pgoutput over
// github.com/jackc/pglogrepl, turning inserts into the outbox table into
// OutboxRows in commit order.

// Stream is one replication connection streaming the outbox. It is not
// safe for concurrent use: one goroutine reads and confirms.
type Stream struct {
	conn      *pgconn.PgConn
	relations map[uint32]*pglogrepl.RelationMessage
	types     *pgtype.Map
	pending   []cdc.Event
}

// OpenStream opens a replication connection (replication=database) with
// the connection settings of pool and starts streaming slot through
// publication from the slot's confirmed position: the server sends only
// transactions that commit after it.
func OpenStream(ctx context.Context, pool *pgxpool.Pool, slot, publication string) (*Stream, error) {
	cfg := pool.Config().ConnConfig.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = postgres.RelayApplicationName
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	args := []string{
		"proto_version '1'",
		"publication_names " + quoteLiteral(publication),
		"messages 'true'",
	}
	if binaryTransfer(conn) {
		args = append(args, "binary 'true'")
	}
	err = pglogrepl.StartReplication(ctx, conn, pgx.Identifier{slot}.Sanitize(), 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: args,
	})
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("start replication of slot %s: %w", slot, err)
	}
	return &Stream{conn: conn, relations: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap()}, nil
}

// binaryTransfer reports whether the server sends column values in their
// binary form when asked (pgoutput's binary option, PostgreSQL 14 and
// later). Binary costs the WAL sender and the relay less than text: no hex
// encoding of the payload, no timestamp formatting and parsing.
func binaryTransfer(conn *pgconn.PgConn) bool {
	// server_version is reported at startup, e.g. "15.19 (Debian 15.19-0+deb12u1)".
	major, _, _ := strings.Cut(conn.ParameterStatus("server_version"), ".")
	m, err := strconv.Atoi(major)
	return err == nil && m >= 14
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
func (c *Stream) Close(ctx context.Context) error { return c.conn.Close(ctx) }

// BackendPID is the WAL sender's process ID.
func (c *Stream) BackendPID() uint32 { return c.conn.PID() }

// Confirm tells the server that everything up to lsn is handled: the slot
// may release WAL before it and a restart resumes after it.
func (c *Stream) Confirm(ctx context.Context, lsn cdc.LSN) error {
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, c.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(lsn)}); err != nil {
		return fmt.Errorf("confirm WAL position %s: %w", lsn, err)
	}
	return nil
}

// Next returns the next stream event, or an cdc.EventNone event when nothing
// arrives before deadline. Any error ends the stream (close it).
func (c *Stream) Next(ctx context.Context, deadline time.Time) (cdc.Event, error) {
	for len(c.pending) == 0 {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := c.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				return cdc.Event{}, nil
			}
			// pgconn closes the connection on any read error but a
			// timeout, which is what ctx's cancellation gives: only then
			// may the caller read on.
			if ctx.Err() != nil && !c.conn.IsClosed() {
				return cdc.Event{}, fmt.Errorf("%w: %w", cdc.ErrInterrupted, ctx.Err())
			}
			return cdc.Event{}, fmt.Errorf("replication stream: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return cdc.Event{}, fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			if err := c.decode(msg.Data); err != nil {
				return cdc.Event{}, err
			}
		case *pgproto3.CopyDone:
			return cdc.Event{}, errors.New("replication stream: the server ended it")
		}
	}
	ev := c.pending[0]
	c.pending = c.pending[1:]
	return ev, nil
}

func (c *Stream) decode(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("replication stream: %w", err)
		}
		c.pending = append(c.pending, cdc.Event{Kind: cdc.EventKeepalive, LSN: cdc.LSN(pkm.ServerWALEnd), ReplyRequested: pkm.ReplyRequested})
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
			c.pending = append(c.pending, cdc.Event{Kind: cdc.EventBegin, LSN: cdc.LSN(m.FinalLSN), CommitTime: m.CommitTime})
		case *pglogrepl.CommitMessage:
			c.pending = append(c.pending, cdc.Event{Kind: cdc.EventCommit, LSN: cdc.LSN(m.TransactionEndLSN), CommitTime: m.CommitTime})
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
			c.pending = append(c.pending, cdc.Event{Kind: cdc.EventRow, LSN: cdc.LSN(xld.WALStart), Row: row})
		case *pglogrepl.LogicalDecodingMessage:
			switch {
			case !m.Transactional && m.Prefix == HeartbeatPrefix:
				c.pending = append(c.pending, cdc.Event{Kind: cdc.EventHeartbeat, LSN: cdc.LSN(m.LSN)})
			case m.Transactional && m.Prefix == RelayedPrefix:
				c.pending = append(c.pending, cdc.Event{Kind: cdc.EventRelayedRows, LSN: cdc.LSN(m.LSN)})
			}
		}
	}
	return nil
}

// decodeRow turns a pgoutput tuple (binary or text format) into an
// OutboxRow, the same values ReadBatch reads.
func (c *Stream) decodeRow(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (core.OutboxRow, error) {
	if tuple == nil || len(tuple.Columns) != len(rel.Columns) {
		return core.OutboxRow{}, errors.New("replication stream: outbox tuple does not match its relation")
	}
	var r outboxrow.Scan
	for i, col := range tuple.Columns {
		rc := rel.Columns[i]
		if col.DataType == pglogrepl.TupleDataTypeNull {
			continue
		}
		dst := r.Column(rc.Name)
		if dst == nil {
			continue
		}
		var err error
		switch col.DataType {
		case pglogrepl.TupleDataTypeBinary:
			err = c.scanBinary(rc.DataType, col.Data, dst)
		case pglogrepl.TupleDataTypeText:
			err = c.scan(rc.DataType, col.Data, dst)
		default:
			err = fmt.Errorf("unexpected tuple data type %q", col.DataType)
		}
		if err != nil {
			return core.OutboxRow{}, fmt.Errorf("replication stream: outbox column %s: %w", rc.Name, err)
		}
	}
	return r.Decode()
}

func (c *Stream) scan(oid uint32, data []byte, dst any) error {
	switch d := dst.(type) {
	case *string:
		// uuid and text arrive as their text form.
		*d = string(data)
		return nil
	case *pgtype.Text:
		*d = pgtype.Text{String: string(data), Valid: true}
		return nil
	case *int64:
		v, err := strconv.ParseInt(string(data), 10, 64)
		*d = v
		return err
	case *int:
		v, err := strconv.Atoi(string(data))
		*d = v
		return err
	case *[]byte:
		// The headers (jsonb) arrive as their text, which is what the
		// decoder parses; the payload (bytea) arrives hex-encoded and is
		// decoded by the type map.
		if oid == pgtype.JSONBOID || oid == pgtype.JSONOID {
			*d = append((*d)[:0], data...)
			return nil
		}
	}
	return c.types.Scan(oid, pgtype.TextFormatCode, data, dst)
}

// scanBinary is scan for a value in its binary form. The tuple's bytes
// belong to the connection's read buffer: everything kept is copied.
func (c *Stream) scanBinary(oid uint32, data []byte, dst any) error {
	switch d := dst.(type) {
	case *string:
		if oid == pgtype.UUIDOID {
			return scanUUID(data, d)
		}
		if oid == pgtype.TextOID || oid == pgtype.VarcharOID {
			*d = string(data)
			return nil
		}
	case *pgtype.Text:
		if oid == pgtype.UUIDOID {
			d.Valid = true
			return scanUUID(data, &d.String)
		}
	case *[]byte:
		switch oid {
		case pgtype.JSONBOID:
			// A version byte (1), then the JSON text.
			if len(data) == 0 || data[0] != 1 {
				return errors.New("jsonb: unknown binary format version")
			}
			*d = append((*d)[:0], data[1:]...)
			return nil
		case pgtype.ByteaOID:
			*d = append(make([]byte, 0, len(data)), data...)
			return nil
		}
	}
	return c.types.Scan(oid, pgtype.BinaryFormatCode, data, dst)
}

func scanUUID(data []byte, dst *string) error {
	id, err := uuid.FromBytes(data)
	if err != nil {
		return fmt.Errorf("uuid: %w", err)
	}
	*dst = id.String()
	return nil
}
