package consolestore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/console"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/cdc"
)

// Store is the operator console's store: the reads and releases of
// `posthorn outbox status|release` and `posthorn consume status|release`,
// each by the same method those commands call, and the console_audit
// table (migration 00007).
type Store struct {
	ledger   *pgxpool.Pool
	relay    *relaystore.Store
	cdc      *cdcsource.Source
	slot     string
	inboxes  map[string]*inboxstore.Inbox
	releaser *inboxstore.Inbox
}

var _ console.Store = (*Store)(nil)

// Config says where the console reads and writes.
type Config struct {
	// Ledger is the ledger pool: the relay's status and release, and the
	// audit log.
	Ledger *pgxpool.Pool
	// Slot is relay.cdc.slot, shown when it exists.
	Slot string
	// Inboxes are the pools each consumer's status is read from, by
	// consumer name (the read-only pools reconcile uses).
	Inboxes map[string]*pgxpool.Pool
	// Release is the pool `posthorn consume release` writes to
	// (consumer.database.url); nil refuses consumer-side releases.
	Release *pgxpool.Pool
}

// New returns the console's store.
func New(cfg Config) *Store {
	s := &Store{ledger: cfg.Ledger, relay: relaystore.New(cfg.Ledger), cdc: cdcsource.New(cfg.Ledger),
		slot: cfg.Slot, inboxes: map[string]*inboxstore.Inbox{}}
	for name, pool := range cfg.Inboxes {
		s.inboxes[name] = inboxstore.New(pool)
	}
	if cfg.Release != nil {
		s.releaser = inboxstore.New(cfg.Release)
	}
	return s
}

// OutboxStatus is relaystore.Store.Status.
func (s *Store) OutboxStatus(ctx context.Context) (core.OutboxStatus, error) {
	return s.relay.Status(ctx)
}

// OutboxTopics counts the outbox rows per topic, written and relayed (no
// outbox_pending row). It reads every row (the outbox has no index that
// counts them cheaper), so its cost grows with the outbox until cleanup
// deletes what is covered.
func (s *Store) OutboxTopics(ctx context.Context) ([]console.TopicCount, error) {
	out, err := pgrows.Query(ctx, s.ledger, pgx.RowToStructByPos[console.TopicCount],
		`SELECT o.topic, count(*), count(*) - count(p.id) FROM outbox o
LEFT JOIN outbox_pending p ON p.shard = o.shard AND p.id = o.id GROUP BY o.topic ORDER BY o.topic`)
	if err != nil {
		return nil, fmt.Errorf("outbox topics: %w", err)
	}
	return out, nil
}

// Slot is cdcsource.Source.SlotStatus of the configured slot, nil when it does
// not exist (polling mode).
func (s *Store) Slot(ctx context.Context) (*cdc.SlotStatus, error) {
	st, err := s.cdc.SlotStatus(ctx, s.slot)
	if err != nil || !st.Exists {
		return nil, err
	}
	return &st, nil
}

// Consumer is Inbox.Count and Inbox.Parked, with the waiting event IDs
// from Inbox.List.
func (s *Store) Consumer(ctx context.Context, name string, eventIDs int) (console.ConsumerStatus, error) {
	in, ok := s.inboxes[name]
	if !ok {
		return console.ConsumerStatus{}, fmt.Errorf("consumer %q: %w", name, core.ErrNotFound)
	}
	c, err := in.Count(ctx, name)
	if err != nil {
		return console.ConsumerStatus{}, err
	}
	st := console.ConsumerStatus{Name: name, Events: c.Events, DuplicatesAbsorbed: c.DuplicatesAbsorbed}
	parked, err := in.Parked(ctx, name)
	if err != nil || len(parked) == 0 {
		return st, err
	}
	ids := map[core.AggregateKey][]string{}
	for _, d := range []core.Disposition{core.DispositionParkedGap, core.DispositionParkedPoison} {
		if eventIDs == 0 {
			break
		}
		recs, err := in.List(ctx, name, d, eventIDs*len(parked))
		if err != nil {
			return st, err
		}
		for _, r := range recs {
			k := core.AggregateKey{Type: r.AggregateType, ID: r.AggregateID}
			if len(ids[k]) < eventIDs {
				ids[k] = append(ids[k], r.EventID)
			}
		}
	}
	for _, p := range parked {
		st.Parked = append(st.Parked, console.ParkedAggregate{AggregateKey: p.AggregateKey, Reason: p.Reason,
			ParkedAt: p.ParkedAt, Events: p.Events, EventIDs: ids[p.AggregateKey]})
	}
	return st, nil
}

// ReleaseRelay is relaystore.Store.Release.
func (s *Store) ReleaseRelay(ctx context.Context, aggregateType, aggregateID string) error {
	return s.relay.Release(ctx, aggregateType, aggregateID)
}

// DeadLetterRelay is relaystore.Store.DeadLetter, without its own audit entry
// (the console writes one for every action).
func (s *Store) DeadLetterRelay(ctx context.Context, aggregateType, aggregateID, eventID, operator string) (string, error) {
	d, err := s.relay.DeadLetter(ctx, aggregateType, aggregateID, eventID, operator, "console", false)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %s: event %s (revision %d) moved to dead_letters; a skip marker (%s) takes its place and the aggregate's later events flow",
		aggregateType, aggregateID, d.EventID, d.Revision, core.TypeDeadLettered), nil
}

// ReleaseConsumer is Inbox.Release on consumer.database.url.
func (s *Store) ReleaseConsumer(ctx context.Context, consumer, aggregateType, aggregateID string) (int, error) {
	if s.releaser == nil {
		return 0, fmt.Errorf("consumer-side release needs consumer.database.url, as `posthorn consume release` does")
	}
	return s.releaser.Release(ctx, consumer, aggregateType, aggregateID)
}

// BeginAudit inserts the entry with outcome started.
func (s *Store) BeginAudit(ctx context.Context, e console.AuditEntry) (int64, error) {
	var id int64
	err := s.ledger.QueryRow(ctx, `INSERT INTO console_audit (operator, remote_addr, action, target)
VALUES ($1, $2, $3, $4) RETURNING id`, e.Operator, e.RemoteAddr, e.Action, e.Target).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("console audit: %w", err)
	}
	return id, nil
}

// FinishAudit records the entry's outcome.
func (s *Store) FinishAudit(ctx context.Context, id int64, outcome console.Outcome, detail string) error {
	if _, err := s.ledger.Exec(ctx, `UPDATE console_audit SET outcome = $2, detail = $3, finished_at = now() WHERE id = $1`,
		id, string(outcome), detail); err != nil {
		return fmt.Errorf("console audit: %w", err)
	}
	return nil
}

// Audit returns the last n entries, newest first.
func (s *Store) Audit(ctx context.Context, n int) ([]console.AuditEntry, error) {
	out, err := pgrows.Query(ctx, s.ledger, pgx.RowToStructByPos[console.AuditEntry], `
SELECT id, at, operator, remote_addr, action, target, outcome, detail, finished_at
FROM console_audit ORDER BY id DESC LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("console audit: %w", err)
	}
	return out, nil
}
