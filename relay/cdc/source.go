package cdc

import (
	"context"
	"errors"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
)

// Source is what the CDC relay needs from the ledger database beside the
// outbox reads it shares with the polling relay (OutboxStore): the slot's
// lease and fenced markers, the slot itself, and the server's state and
// history. Every method but OpenStream is one short statement and safe for
// concurrent use.
//
// Who may implement it: adapters/postgres/cdcsource.Source alone; the relay's
// reasoning about slots, confirmed positions and timelines is PostgreSQL's
// logical replication, not a general stream's.
type Source interface {
	SlotLease
	Markers
	Slots
	Server
}

// SlotLease is the slot's lease (relay.go): one reader per slot, each grant
// with a new fencing token.
type SlotLease interface {
	// AcquireLease takes slot's lease for owner if it is free, expired or
	// owner's own, with a new fencing token; ok is false when another relay
	// holds it.
	AcquireLease(ctx context.Context, slot, owner string, ttl time.Duration) (l Lease, ok bool, err error)
	// RenewLease extends the lease if owner still holds it under the same
	// token; false means it was lost.
	RenewLease(ctx context.Context, l Lease, owner string, ttl time.Duration) (bool, error)
	// ReleaseLease frees the lease if owner still holds it.
	ReleaseLease(ctx context.Context, l Lease, owner string) error
}

// Markers are the CDC relay's markers (deliver.go, stream.go), fenced by
// the slot's lease.
type Markers interface {
	// MarkRelayed writes the markers of the rows refs if l is still the
	// slot's current grant (fenced is true, and nothing is marked, when it
	// is not); invisible lists the rows the statement could not see yet.
	MarkRelayed(ctx context.Context, refs []core.RowRef, l Lease) (marked int, invisible []core.RowRef, fenced bool, err error)
	// Marked returns which of ids already carry a marker.
	Marked(ctx context.Context, ids []int64) (map[int64]bool, error)
}

// Slots is the replication slot and its stream (stream.go).
type Slots interface {
	// SlotStatus reads slot's state; Exists is false when there is none.
	SlotStatus(ctx context.Context, slot string) (SlotStatus, error)
	// CreateSlot creates slot and returns its consistent point, once every
	// transaction committed before it is visible.
	CreateSlot(ctx context.Context, slot string) (LSN, error)
	// DropSlot drops slot if it exists.
	DropSlot(ctx context.Context, slot string) error
	// TerminateReader ends the WAL sender streaming slot, if any.
	TerminateReader(ctx context.Context, slot string) error
	// EmitHeartbeat writes a heartbeat message into the WAL and returns
	// its position.
	EmitHeartbeat(ctx context.Context) (LSN, error)
	// OpenStream starts streaming slot through publication from the slot's
	// confirmed position; an error wrapping ErrSlotInUse means another WAL
	// sender streams it.
	OpenStream(ctx context.Context, slot, publication string) (Stream, error)
}

// Server is the ledger server's state and history as the relay checks it
// (stream.go, branch.go).
type Server interface {
	// CheckServer reports, wrapped in ErrNotAvailable, why the server cannot
	// stream the outbox.
	CheckServer(ctx context.Context) error
	// EnsurePublication creates the outbox's publication if it is missing.
	EnsurePublication(ctx context.Context, publication string) error
	// OutboxMaxID is the largest outbox id (0 when empty).
	OutboxMaxID(ctx context.Context) (int64, error)
	// CurrentWALLSN is the server's current WAL insert position: at or past
	// the commit of every transaction visible when it is read.
	CurrentWALLSN(ctx context.Context) (LSN, error)
	// Timeline is the timeline of the history the server writes on; a
	// promotion starts a new one.
	Timeline(ctx context.Context) (int32, error)
	// BranchPoint is the WAL position at which the server's history left
	// timeline (its switchpoint): WAL written on timeline past it is not in
	// the server's history. 0 when the server still writes on timeline; an
	// error when timeline is not in its history at all.
	BranchPoint(ctx context.Context, timeline int32) (LSN, error)
}

// Stream is one replication connection streaming the outbox. It is not safe
// for concurrent use: one goroutine reads and confirms.
type Stream interface {
	// Next returns the next event, or an EventNone event when nothing
	// arrives before deadline. An error wrapping ErrInterrupted means ctx
	// ended while the read waited and the stream is intact; any other
	// error ends the stream (close it).
	Next(ctx context.Context, deadline time.Time) (Event, error)
	// Confirm tells the server that everything up to lsn is handled.
	Confirm(ctx context.Context, lsn LSN) error
	// BackendPID is the WAL sender's process ID.
	BackendPID() uint32
	// Close ends the stream and its connection.
	Close(ctx context.Context) error
}

// LSN is a WAL position: a byte offset into the write-ahead log (the
// standby gate's of both modes).
type LSN = relay.LSN

// ErrInterrupted is wrapped by Stream.Next's error when its context ended
// while it waited and the connection is intact, so reading can go on.
var ErrInterrupted = errors.New("replication stream read interrupted")

// ErrNotAvailable wraps the reasons the server cannot serve the CDC relay
// (wal_level, the REPLICATION attribute).
var ErrNotAvailable = errors.New("CDC relay mode is not available on this server")

// ErrSlotInUse is wrapped by OpenStream's error when another WAL sender
// streams the slot.
var ErrSlotInUse = errors.New("replication slot is in use")

// Lease is a held slot lease; Token is the fencing token of this grant.
type Lease struct {
	Slot  string
	Token int64
	// PreviousOwner is set when the lease was taken over from another relay
	// whose lease had expired.
	PreviousOwner string
	// SlotCreatedAt is when a relay last created the slot (zero: never).
	SlotCreatedAt time.Time
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

// EventKind tells what a Event carries.
type EventKind int

const (
	// EventNone: nothing arrived before the deadline.
	EventNone EventKind = iota
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
	// EventRelayedRows says that the open transaction inserted outbox rows
	// as relayed (a failover recovery re-committing what the world already
	// has): its rows are sent only if they still lack their marker. It
	// comes before the transaction's rows.
	EventRelayedRows
)

// Event is one decoded item of the replication stream.
type Event struct {
	Kind EventKind
	LSN  LSN
	// CommitTime is the commit time of the transaction (Begin, Commit).
	CommitTime time.Time
	Row        core.OutboxRow
	// ReplyRequested is set on a keepalive that asks for a status update
	// now.
	ReplyRequested bool
}

// OutboxStore is what the CDC relay reads from the outbox: what it shares
// with the polling relay (the catch-up read, parking, the gauges' figures)
// and the parked aggregates, whose release starts a catch-up.
type OutboxStore interface {
	relay.Outbox
	// Parked lists the parked aggregates.
	Parked(ctx context.Context) ([]core.ParkedAggregate, error)
}
