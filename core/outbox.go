package core

import (
	"errors"
	"fmt"
	"time"
)

// The outbox as the relays, the operator commands and the ledger store see
// it: the rows, the shard leases that fence the markers, and the parked
// aggregates.

// AggregateKey names an aggregate: the unit of ordering. Per aggregate,
// revisions are gapless and outbox id order is revision order; everything
// that holds records back or parks them does so per AggregateKey.
type AggregateKey struct {
	Type, ID string
}

// Aggregate returns the key of e's aggregate.
func (e Envelope) Aggregate() AggregateKey { return AggregateKey{e.AggregateType, e.AggregateID} }

// String is the key as one string ("type\x00id"), for hashing.
func (k AggregateKey) String() string { return k.Type + "\x00" + k.ID }

// RowRef names an outbox row and its shard: what a marker needs to find
// the row's entry in the work queue.
type RowRef struct {
	ID    int64
	Shard int
}

// OutboxRow is one unrelayed outbox row.
type OutboxRow struct {
	RowRef
	Envelope Envelope
}

// Envelopes returns the envelopes of rows, in order: the batch a relay
// publishes.
func Envelopes(rows []OutboxRow) []Envelope {
	batch := make([]Envelope, len(rows))
	for i, row := range rows {
		batch[i] = row.Envelope
	}
	return batch
}

// ReadOrder selects the order unrelayed rows are read in.
type ReadOrder int

const (
	// OrderByID is the only correct order: per aggregate, outbox id order is
	// revision order because each row is inserted under its aggregate's row
	// lock.
	OrderByID ReadOrder = iota
	// OrderByXIDUnsafe orders by the writing transaction's ID. It exists only
	// as the negative control of the ordering tests: a transaction that took
	// its ID early and waited for a row lock commits a later revision with a
	// smaller ID, so this order can send revision r+1 before r.
	OrderByXIDUnsafe
)

// Lease is a held shard lease. Token is the fencing token of this grant.
type Lease struct {
	Shard int
	Token int64
	// PreviousOwner is set on acquisition when the lease was taken over
	// from another relay whose lease had expired.
	PreviousOwner string
}

// ParkedAggregate is an aggregate the relay stopped reading because the sink
// rejected one of its records for good.
type ParkedAggregate struct {
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventID       string    `json:"event_id"`
	Reason        string    `json:"reason"`
	ParkedAt      time.Time `json:"parked_at"`
}

// Key returns the parked aggregate's key.
func (p ParkedAggregate) Key() AggregateKey { return AggregateKey{p.AggregateType, p.AggregateID} }

// ErrNotParked is returned when releasing an aggregate that is not parked.
var ErrNotParked = errors.New("aggregate is not parked")

// ShardLease is one shard's lease as shown by status.
type ShardLease struct {
	Shard     int        `json:"shard"`
	Owner     string     `json:"owner,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Backlog   int64      `json:"backlog"`
}

// OutboxStatus is what `posthorn outbox status` shows and the relay's gauges
// report. Fields are added, never renamed (scripts read the JSON).
type OutboxStatus struct {
	Backlog            int64             `json:"backlog"`
	OldestUnrelayedAge float64           `json:"oldest_unrelayed_age_seconds"`
	Shards             []ShardLease      `json:"shards"`
	Parked             []ParkedAggregate `json:"parked"`
	// History is the ledger's history and the accepted one; while they
	// differ the relay publishes nothing and the API takes no posting.
	History *LedgerHistory `json:"ledger_history,omitempty"`
	// Horizon is what holds the ledger database's MVCC horizon back the
	// furthest, if anything does.
	Horizon *LedgerHorizon `json:"ledger_horizon,omitempty"`
}

// ErrHistoryNotAccepted is returned while the ledger runs on a history
// (LedgerHistory) other than the one an operator accepted last: after a
// failover or a restore, until posthorn failover recover accepts it.
// Nothing is posted or published meanwhile.
var ErrHistoryNotAccepted = errors.New("the ledger runs on a history that was not accepted: a failover or restore happened, and it may lack postings that were published; run posthorn failover check, then posthorn failover recover")

// LedgerHistory is the history the ledger's server writes on (its
// PostgreSQL system identifier and timeline) and the one an operator
// accepted last. Promotion of a standby (and a point-in-time restore)
// starts a new timeline, and a restored dump runs on another system
// identifier: the new history may lack postings the world has seen, so
// nothing is published or posted on it until the failover check accepts it.
type LedgerHistory struct {
	Accepted                 bool  `json:"accepted"`
	SystemIdentifier         int64 `json:"system_identifier"`
	Timeline                 int32 `json:"timeline"`
	AcceptedSystemIdentifier int64 `json:"accepted_system_identifier"`
	AcceptedTimeline         int32 `json:"accepted_timeline"`
}

// String says which history the ledger runs on and whether it is the
// accepted one.
func (h LedgerHistory) String() string {
	if h.Accepted {
		return fmt.Sprintf("system %d, timeline %d (accepted)", h.SystemIdentifier, h.Timeline)
	}
	return fmt.Sprintf("system %d, timeline %d, NOT the accepted history (system %d, timeline %d)",
		h.SystemIdentifier, h.Timeline, h.AcceptedSystemIdentifier, h.AcceptedTimeline)
}

// LedgerHorizon is what holds the ledger database's MVCC horizon back the
// furthest: row versions deleted or updated after it began cannot be
// removed by VACUUM while it lives, so tables that churn (the relay's
// queue, per-aggregate revisions, balances) keep their dead versions. The
// zero value (Kind "") is nothing beyond the running transactions.
type LedgerHorizon struct {
	// Kind is session (a backend's snapshot or transaction: a report,
	// pg_dump, an idle-in-transaction connection), prepared (a two-phase
	// transaction), slot (a replication slot's xmin: a standby's
	// hot_standby_feedback through its slot) or standby (a standby's
	// feedback without a slot).
	Kind string `json:"kind"`
	// Holder names it: the session's application name (or user) and pid,
	// the prepared transaction's gid, the slot's name, the standby's
	// application name and its WAL sender's pid.
	Holder string `json:"holder"`
	// State is a session's state (active, idle in transaction …).
	State string `json:"state,omitempty"`
	// XIDAge is how many transactions the horizon is behind.
	XIDAge int64 `json:"xid_age"`
	// Xmin is the horizon itself (a 32-bit transaction ID).
	Xmin int64 `json:"xmin"`
	// AgeSeconds is how long it has held the horizon: a session's or a
	// prepared transaction's age; for a slot or a standby, how long the
	// reader has seen this xmin (a lower bound). Negative while unknown.
	AgeSeconds float64 `json:"age_seconds"`
}
