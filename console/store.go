package console

import (
	"context"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/cdc"
)

// Store is what the console reads and the two releases it may run, each
// the same call as its CLI command (adapters/postgres/consolestore.Store
// implements it over relaystore.Store, cdcsource.Source and Inbox), plus the audit log
// its actions are recorded in.
//
// Who may implement it: consolestore.Store alone, so that the console's figures
// and actions are the CLI's own calls; a second implementation would be a
// second definition of the same figures, which the console must not have.
type Store interface {
	// OutboxStatus is what `posthorn outbox status` shows: backlog, oldest
	// unrelayed age, shard leases and the relay's parked aggregates.
	OutboxStatus(ctx context.Context) (core.OutboxStatus, error)
	// OutboxTopics counts the outbox rows per topic, written and relayed
	// (with their relay marker): the events on the wire that a consumer's
	// lag is measured against. Rows, not ids: an id a rolled-back, refused
	// or replayed posting used up is no row and no event.
	OutboxTopics(ctx context.Context) ([]TopicCount, error)
	// Slot is the CDC replication slot's status, nil when there is none.
	Slot(ctx context.Context) (*cdc.SlotStatus, error)
	// Consumer is one consumer's dispositions and parked aggregates, as
	// `posthorn consume status` shows them, with up to eventIDs of each
	// parked aggregate's waiting event IDs.
	Consumer(ctx context.Context, name string, eventIDs int) (ConsumerStatus, error)

	// ReleaseRelay is `posthorn outbox release`: the relay sends the
	// aggregate again from its parked record; core.ErrNotParked when it is
	// not parked.
	ReleaseRelay(ctx context.Context, aggregateType, aggregateID string) error
	// DeadLetterRelay is `posthorn outbox dead-letter`: the parked record
	// (eventID, when not empty, must be it) goes to the dead_letters table
	// with operator, a skip marker takes its place and the park is lifted.
	// It returns what it did. The console audits the action itself.
	DeadLetterRelay(ctx context.Context, aggregateType, aggregateID, eventID, operator string) (string, error)
	// ReleaseConsumer is `posthorn consume release`: it lifts the
	// consumer's park of the aggregate and returns how many events go back
	// to being re-driven.
	ReleaseConsumer(ctx context.Context, consumer, aggregateType, aggregateID string) (int, error)

	// BeginAudit records an action before it runs and returns the entry's
	// ID; FinishAudit records its outcome.
	BeginAudit(ctx context.Context, e AuditEntry) (int64, error)
	FinishAudit(ctx context.Context, id int64, outcome Outcome, detail string) error
	// Audit returns the last n entries, newest first.
	Audit(ctx context.Context, n int) ([]AuditEntry, error)
}

// TopicCount is one topic's outbox rows.
type TopicCount struct {
	Topic string
	// Written is every row; Relayed the rows with their relay marker.
	Written, Relayed int64
}

// ConsumerStatus is one consumer's inbox summary.
type ConsumerStatus struct {
	Name string
	// Events counts the consumer's event IDs per disposition.
	Events map[core.Disposition]int64
	// DuplicatesAbsorbed is every repeat the inbox kept from the handler.
	DuplicatesAbsorbed int64
	Parked             []ParkedAggregate
}

// Recorded is how many event IDs have a disposition of any kind.
func (c ConsumerStatus) Recorded() int64 {
	var n int64
	for _, k := range c.Events {
		n += k
	}
	return n
}

// ParkedAggregate is an aggregate a consumer parked, with the event IDs
// that wait for it.
type ParkedAggregate struct {
	core.AggregateKey
	Reason   string
	ParkedAt time.Time
	// Events is how many of its events wait; EventIDs names the first.
	Events   int
	EventIDs []string
}

// Outcome is how an audited action ended.
type Outcome string

// The outcomes of an audit entry.
const (
	OutcomeStarted Outcome = "started"
	OutcomeOK      Outcome = "ok"
	OutcomeFailed  Outcome = "failed"
)

// AuditEntry is one confirmed console action: who (the operator's name as
// given in the confirmation, and the address it came from), when, what, and
// how it ended.
type AuditEntry struct {
	ID         int64
	At         time.Time
	Operator   string
	RemoteAddr string
	Action     string
	Target     string
	Outcome    Outcome
	Detail     string
	FinishedAt *time.Time
}
