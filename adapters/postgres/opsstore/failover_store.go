package opsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/internal/outboxrow"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// FailoverStore is ops.FailoverStore on the ledger database. Its reads
// need what roles/ledger.sql grants posthorn_maintainer; its one write,
// Recover, goes through the definer functions of migration 00012.
type FailoverStore struct{ pool *pgxpool.Pool }

var (
	_ ops.FailoverStore = (*FailoverStore)(nil)
	_ ops.ParkedSource  = InboxSeen{}
	_ ops.MarkedSource  = InboxSeen{}
	_ ops.MarkedSource  = AuditLogSeen{}
)

// NewFailoverStore returns the failover store of the ledger on pool.
func NewFailoverStore(pool *pgxpool.Pool) *FailoverStore { return &FailoverStore{pool: pool} }

// History reads the server's history and the one accepted last.
func (s *FailoverStore) History(ctx context.Context) (ops.LedgerHistory, error) {
	return postgres.ReadHistory(ctx, s.pool)
}

// inspectSettings are set for Inspect's transaction only. jit off: the
// server plans each batch for the number of events it holds, and on a
// ledger of millions of rows that plan's price is past
// jit_optimize_above_cost: compiling took half a second per batch on a
// 10M-event ledger, where the lookups of its 2,000 events took 30 ms, so
// the check of a few thousand events since the reconcile marks grew with
// the history.
const inspectSettings = `SELECT set_config('jit', 'off', true)`

// inspectEvents is Inspect's lookup: one row per seen event.
const inspectEvents = `
SELECT u.id::text,
       coalesce(k.by_id OR k.line = nullif(u.j, '')::uuid
                OR (k.row_at_revision IS NULL AND k.recorded IS NULL
                    AND ((u.j = '' AND k.line IS NOT NULL) OR k.floor >= u.r)), false),
       coalesce('journal ' || k.line::text, 'outbox event ' || k.row_at_revision::text, ''),
       coalesce(k.recorded, '')
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[]) AS u(id, t, a, r, j),
LATERAL (SELECT EXISTS (SELECT 1 FROM outbox AS o WHERE o.event_id = u.id) AS by_id,
                (SELECT l.journal_id FROM journal_lines AS l
                 WHERE u.t = 'account' AND l.account_id = u.a AND l.revision = u.r) AS line,
                (SELECT o.event_id FROM outbox AS o
                 WHERE o.aggregate_type = u.t AND o.aggregate_id = u.a AND o.revision = u.r) AS row_at_revision,
                (SELECT f.reason FROM posthorn.failover_lost AS f WHERE f.event_id = u.id) AS recorded,
                (SELECT p.revision FROM posthorn_aggregates AS p
                 WHERE u.t <> 'account' AND p.aggregate_type = u.t AND p.aggregate_id = u.a) AS floor) AS k`

// Inspect says, per seen event, whether the ledger holds it, what holds
// its revision otherwise, and whether a recovery recorded it lost. The
// ledger holds an event whose ID is in the outbox; once cleanup removed
// the outbox row, a posting's event whose journal the copy names when that
// journal has a line at its account and revision; and one whose copy names
// no journal (an inbox keeps none for an applied event) when a line holds
// its account and revision, no outbox row does (cleanup removed the line's
// event, which it does only to a published, archived and reconciled row),
// and no recovery recorded it lost. A service's event is held the same way
// by its aggregate's revision floor, which cleanup raises to the highest
// revision it removes: at or below the floor, no outbox row at its
// revision, not recorded lost. That line's (or removed row's) event is the
// seen one: a revision is published twice only across a failover, and
// then the reissued row is not relayed, so not cleaned up, before a
// recovery records the first as lost.
func (s *FailoverStore) Inspect(ctx context.Context, seen []ops.SeenEvent) (map[string]ops.EventState, error) {
	n := len(seen)
	ids, types, aggs, journals := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	revs := make([]int64, n)
	for i, e := range seen {
		ids[i], types[i], aggs[i], revs[i] = e.EventID, e.AggregateType, e.AggregateID, e.Revision
		if _, err := uuid.Parse(e.JournalID); err == nil {
			journals[i] = e.JournalID
		}
	}
	out := make(map[string]ops.EventState, n)
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, inspectSettings); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, inspectEvents, ids, types, aggs, revs, journals)
		if err != nil {
			return err
		}
		var id string
		var st ops.EventState
		_, err = pgx.ForEachRow(rows, []any{&id, &st.Held, &st.TakenBy, &st.Recorded}, func() error {
			out[id] = st
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect the seen events: %w", err)
	}
	return out, nil
}

// Revisions reads each aggregate's revision: the ledger's accounts in
// account_revisions, a service's aggregates the greater of posthorn_aggregates' floor and the
// newest in the outbox (a publish locks that row without raising it).
func (s *FailoverStore) Revisions(ctx context.Context, aggs []ops.AggregateKey) (map[ops.AggregateKey]int64, error) {
	types, ids := make([]string, len(aggs)), make([]string, len(aggs))
	for i, k := range aggs {
		types[i], ids[i] = k.Type, k.ID
	}
	rows, err := s.pool.Query(ctx, `
SELECT u.t, u.i, coalesce(CASE WHEN u.t = 'account' THEN (SELECT a.revision FROM account_revisions AS a WHERE a.id = u.i)
       ELSE greatest((SELECT p.revision FROM posthorn_aggregates AS p WHERE p.aggregate_type = u.t AND p.aggregate_id = u.i),
                     (SELECT max(o.revision) FROM outbox AS o WHERE o.aggregate_type = u.t AND o.aggregate_id = u.i)) END, 0)
FROM unnest($1::text[], $2::text[]) AS u(t, i)`, types, ids)
	if err != nil {
		return nil, fmt.Errorf("read revisions: %w", err)
	}
	out := make(map[ops.AggregateKey]int64, len(aggs))
	var k ops.AggregateKey
	var rev int64
	if _, err := pgx.ForEachRow(rows, []any{&k.Type, &k.ID, &rev}, func() error {
		out[k] = rev
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read revisions: %w", err)
	}
	return out, nil
}

// Sequences reads the last values the outbox ids and the journal sequence
// gave out.
func (s *FailoverStore) Sequences(ctx context.Context) (int64, int64, error) {
	var outboxID, journal int64
	err := s.pool.QueryRow(ctx, `
SELECT (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM outbox_id_seq),
       (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM journal_sequence)`).Scan(&outboxID, &journal)
	if err != nil {
		return 0, 0, fmt.Errorf("read the sequences: %w", err)
	}
	return outboxID, journal, nil
}

// Recover writes plan and accepts the server's history, in one
// transaction: the relay resumes only once nothing can be reissued.
func (s *FailoverStore) Recover(ctx context.Context, plan ops.RecoveryPlan, note string) (ops.RecoveryResult, error) {
	var res ops.RecoveryResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The sequences move first, so the re-committed journals take
		// sequence numbers past any the old primary gave out.
		n := len(plan.Moves)
		types, ids, revs := make([]string, n), make([]string, n), make([]int64, n)
		for i, m := range plan.Moves {
			types[i], ids[i], revs[i] = m.AggregateType, m.AggregateID, m.Seen
		}
		if err := tx.QueryRow(ctx, `SELECT sequences_moved, aggregates_moved FROM posthorn.failover_advance($1, $2, $3, $4, $5)`,
			plan.OutboxIDPast, plan.JournalSequencePast, types, ids, revs).Scan(&res.SequencesMoved, &res.AggregatesMoved); err != nil {
			return fmt.Errorf("move sequences and revisions: %w", err)
		}
		for _, j := range plan.Rebuild {
			lines := make([]ops.RebuildLine, len(j.Lines))
			for i, l := range j.Lines {
				l.Headers = ledgerHeaders(l.Headers)
				lines[i] = l
			}
			doc, err := json.Marshal(lines)
			if err != nil {
				return err
			}
			var seq *int64
			if err := tx.QueryRow(ctx, `SELECT posthorn.failover_rebuild($1::text::uuid, $2, $3::jsonb)`,
				j.JournalID, j.PostedAt, string(doc)).Scan(&seq); err != nil {
				return fmt.Errorf("re-commit journal %s: %w", j.JournalID, err)
			}
			if seq != nil {
				res.Rebuilt = append(res.Rebuilt, j.JournalID)
				res.JournalSequences = append(res.JournalSequences, *seq)
			}
		}
		for _, l := range plan.Record {
			var journal *string
			if _, err := uuid.Parse(l.JournalID); err == nil {
				journal = &l.JournalID
			}
			var fresh bool
			if err := tx.QueryRow(ctx, `SELECT posthorn.failover_record_lost($1::text::uuid, $2, $3, $4, $5::text::uuid, $6, $7)`,
				l.EventID, l.AggregateType, l.AggregateID, l.Revision, journal, l.Reason, joinSources(l.SeenBy)).Scan(&fresh); err != nil {
				return fmt.Errorf("record lost event %s: %w", l.EventID, err)
			}
			if fresh {
				res.Recorded++
			}
		}
		for _, k := range plan.Keys {
			var fresh bool
			if err := tx.QueryRow(ctx, `SELECT posthorn.failover_record_key($1, $2::text::uuid, $3, $4, $5)`,
				k.Digest, k.JournalID, k.Restored, k.Reason, k.PostedAt).Scan(&fresh); err != nil {
				return fmt.Errorf("record the idempotency key of journal %s: %w", k.JournalID, err)
			}
			switch {
			case fresh && k.Restored:
				res.KeysRestored++
			case fresh:
				res.KeysLost++
			}
		}
		if _, err := tx.Exec(ctx, `SELECT posthorn.failover_accept($1)`, note); err != nil {
			return fmt.Errorf("accept the ledger's history: %w", err)
		}
		res.HistoryAccepted = true
		return nil
	})
	if err != nil {
		return ops.RecoveryResult{}, err
	}
	return res, nil
}

// ledgerHeaders are the headers of h the ledger's write path stores on an
// account's event (outboxrow.LedgerEventHeader); never nil. A record read
// back from a sink carries more (the contract's headers, which have
// columns, and whatever the transport added), none of which the row may
// store: the relay would send it again, and a sink refuse it for good.
func ledgerHeaders(h map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		if outboxrow.LedgerEventHeader(k) {
			out[k] = v
		}
	}
	return out
}

// Backlog reads the relay's parked aggregates and how many outbox rows
// are unrelayed, and the oldest one's age.
func (s *FailoverStore) Backlog(ctx context.Context) (ops.RelayBacklog, error) {
	var b ops.RelayBacklog
	err := s.pool.QueryRow(ctx, `
SELECT count(*), coalesce(extract(epoch FROM now() - min(o.created_at)), 0)::float8
FROM outbox_pending p CROSS JOIN LATERAL (SELECT created_at FROM outbox o WHERE o.id = p.id OFFSET 0) o`).
		Scan(&b.Unrelayed, &b.OldestSeconds)
	if err != nil {
		return b, fmt.Errorf("read the relay's backlog: %w", err)
	}
	rows, err := s.pool.Query(ctx, `
SELECT aggregate_type, aggregate_id, event_id::text, reason, parked_at FROM relay_parked ORDER BY parked_at, aggregate_id`)
	if err != nil {
		return b, fmt.Errorf("read the relay's parked aggregates: %w", err)
	}
	if b.Parked, err = pgx.CollectRows(rows, pgx.RowToStructByPos[core.ParkedAggregate]); err != nil {
		return b, fmt.Errorf("read the relay's parked aggregates: %w", err)
	}
	return b, nil
}

// Witnessed reports whether consumer's coverage on the ledger carries
// witness.
func (s *FailoverStore) Witnessed(ctx context.Context, consumer, witness string) (bool, error) {
	var held bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM ops_coverage WHERE consumer = $1 AND witness::text = $2)`,
		consumer, witness).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("read the coverage witness of %s: %w", consumer, err)
	}
	return held, nil
}

func joinSources(s []string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// InboxSeen is what one consumer's inbox holds (table consumer_inbox):
// every event ID it recorded, with its aggregate and revision. The inbox
// keeps an event's headers and payload only while it is held or parked,
// so for an applied event it gives neither journal nor amount.
type InboxSeen struct {
	Pool     *pgxpool.Pool
	Consumer string
}

// SourceName names the source in reports.
func (s InboxSeen) SourceName() string { return "inbox of " + s.Consumer }

// Parked lists the aggregates the consumer parked, with their reasons.
func (s InboxSeen) Parked(ctx context.Context) ([]ops.ConsumerParked, error) {
	rows, err := s.Pool.Query(ctx, `
SELECT consumer, aggregate_type, aggregate_id, coalesce(parked_reason, '') FROM consumer_positions
WHERE consumer = $1 AND parked ORDER BY parked_at, aggregate_id`, s.Consumer)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[ops.ConsumerParked])
}

// SeenMark reads the consumer's reconciliation mark (ops.MarkedSource).
func (s InboxSeen) SeenMark(ctx context.Context) (ops.SeenMark, error) {
	return seenMark(ctx, s.Pool, s.Consumer)
}

// SeenSince reads the consumer's inbox rows changed at or after since, a
// page at a time through the index on (consumer, changed_xid, event_id).
// The plain "changed_xid >=" is what lets the planner use that partial
// index (rows with a changed_xid only): the row comparison alone does not
// prove it, and each page was a scan of the whole inbox.
func (s InboxSeen) SeenSince(ctx context.Context, since uint64, each func([]ops.SeenEvent) error) error {
	return seenSincePages(ctx, s.Pool, `
SELECT changed_xid::text, event_id, kind, type, aggregate_type, aggregate_id, revision, headers, payload
FROM consumer_inbox WHERE consumer = $1 AND changed_xid >= $2::text::xid8 AND (changed_xid, event_id) > ($2::text::xid8, $3)
ORDER BY consumer_inbox.changed_xid, event_id LIMIT $4`, s.Consumer, since, func(rows pgx.CollectableRow) (sinceRow, error) {
		var r sinceRow
		var headers []byte
		if err := rows.Scan(&r.xid, &r.EventID, &r.Kind, &r.Type, &r.AggregateType, &r.AggregateID, &r.Revision, &headers, &r.Payload); err != nil {
			return r, err
		}
		r.seen = r.AggregateID != ""
		return r, inboxHeaders(&r.SeenEvent, headers)
	}, each)
}

// Seen reads every event of the consumer's inbox, a page at a time in
// event ID order (each page a short statement, so the read never holds a
// snapshot on the consumer's database for its whole length).
func (s InboxSeen) Seen(ctx context.Context, each func([]ops.SeenEvent) error) error {
	return seenPages(ctx, s.Pool, `
SELECT event_id, kind, type, aggregate_type, aggregate_id, revision, headers, payload
FROM consumer_inbox WHERE consumer = $1 AND event_id > $2 AND aggregate_id <> '' ORDER BY event_id LIMIT $3`,
		[]any{s.Consumer}, func(rows pgx.CollectableRow) (ops.SeenEvent, error) {
			var e ops.SeenEvent
			var headers []byte
			if err := rows.Scan(&e.EventID, &e.Kind, &e.Type, &e.AggregateType, &e.AggregateID, &e.Revision, &headers, &e.Payload); err != nil {
				return e, err
			}
			return e, inboxHeaders(&e, headers)
		}, each)
}

// inboxHeaders sets e's headers, and its journal from them, from an inbox
// row's headers column.
func inboxHeaders(e *ops.SeenEvent, headers []byte) error {
	if len(headers) == 0 {
		return nil
	}
	if err := json.Unmarshal(headers, &e.Headers); err != nil {
		return fmt.Errorf("event %q: headers: %w", e.EventID, err)
	}
	e.JournalID = e.Headers[core.HeaderJournalID]
	return nil
}

// seenMark reads consumer's reconciliation mark and whether the failover
// check may read from it: it names this server (rows' transaction IDs mean
// nothing on another), lies at or below the oldest running transaction, as
// every mark taken on this server does, carries a witness, and retention
// has deleted no row changed at or after it.
func seenMark(ctx context.Context, pool *pgxpool.Pool, consumer string) (ops.SeenMark, error) {
	m := ops.SeenMark{Consumer: consumer}
	var (
		mark, witness                   *string
		sameServer, behind, prunedSince *bool
	)
	err := pool.QueryRow(ctx, `
SELECT m.mark::text, m.ledger_witness::text, m.server = (SELECT system_identifier FROM pg_control_system()),
       m.mark <= pg_snapshot_xmin(pg_current_snapshot()), r.pruned_xid >= m.mark
FROM (SELECT 1) AS one LEFT JOIN consumer_reconciled AS m ON m.consumer = $1
     LEFT JOIN consumer_retention AS r ON r.consumer = $1`, consumer).Scan(&mark, &witness, &sameServer, &behind, &prunedSince)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "42P01" || pgErr.Code == "42703"):
		// A role that may not read the marks (the reconciler's may), or a
		// consumer database not migrated since they came: read whole.
		m.Why = "the mark could not be read: " + pgErr.Message
		return m, nil
	case err != nil:
		return m, fmt.Errorf("read the reconciliation mark of %s: %w", consumer, err)
	}
	switch {
	case mark == nil:
		m.Why = "no clean reconciliation pass has recorded a mark"
	case witness == nil:
		m.Why = "the mark carries no witness (recorded before the ledger's coverage kept one)"
	case !*sameServer:
		m.Why = "the mark was recorded on another database server (restored from a dump?)"
	case !*behind:
		m.Why = "the mark lies ahead of this server's oldest running transaction"
	case prunedSince != nil && *prunedSince:
		m.Why = "retention deleted inbox rows changed at or after the mark"
	default:
		if m.Since, err = strconv.ParseUint(*mark, 10, 64); err != nil {
			return m, fmt.Errorf("mark %q of %s: %w", *mark, consumer, err)
		}
		m.Witness = *witness
	}
	return m, nil
}

// sinceRow is a row of a read from a mark: the event (when seen) and the
// inbox row's key the next page starts after.
type sinceRow struct {
	ops.SeenEvent
	xid  string
	seen bool
}

// seenSincePages hands each the events of query from since on, a page of
// ops.SeenBatch inbox rows at a time. query takes consumer, then the
// (changed_xid, event_id) the page starts after and the page size, and
// orders by both; a row with seen false only moves the key.
func seenSincePages(ctx context.Context, pool *pgxpool.Pool, query, consumer string, since uint64,
	scan pgx.RowToFunc[sinceRow], each func([]ops.SeenEvent) error) error {
	afterXID, afterID := strconv.FormatUint(since, 10), ""
	for {
		rows, err := pool.Query(ctx, query, consumer, afterXID, afterID, ops.SeenBatch)
		if err != nil {
			return err
		}
		page, err := pgx.CollectRows(rows, scan)
		if err != nil {
			return err
		}
		events := make([]ops.SeenEvent, 0, len(page))
		for _, r := range page {
			if r.seen {
				events = append(events, r.SeenEvent)
			}
		}
		if len(events) > 0 {
			if err := each(events); err != nil {
				return err
			}
		}
		if len(page) < ops.SeenBatch {
			return nil
		}
		afterXID, afterID = page[len(page)-1].xid, page[len(page)-1].EventID
	}
}

// seenPages hands each the rows of query a page of ops.SeenBatch at a
// time. query takes args, then the last event ID read and the page size,
// and orders by event ID.
func seenPages(ctx context.Context, pool *pgxpool.Pool, query string, args []any,
	scan pgx.RowToFunc[ops.SeenEvent], each func([]ops.SeenEvent) error) error {
	after := ""
	for {
		rows, err := pool.Query(ctx, query, append(args, after, ops.SeenBatch)...)
		if err != nil {
			return err
		}
		page, err := pgx.CollectRows(rows, scan)
		if err != nil {
			return err
		}
		if len(page) == 0 {
			return nil
		}
		if err := each(page); err != nil {
			return err
		}
		if len(page) < ops.SeenBatch {
			return nil
		}
		after = page[len(page)-1].EventID
	}
}

// AuditLogSeen is what the example consumer audit-log keeps: every event
// it applied, whole (table audit_log: journal, payload and idempotency
// digest), so it gives the amounts and keys of the events the inboxes no
// longer keep.
type AuditLogSeen struct {
	Pool *pgxpool.Pool
	// Consumer is the audit log's consumer (its inbox rows are written
	// with the audit log's, in one transaction): a read from its mark
	// finds the audit log's rows through them.
	Consumer string
}

// SeenMark reads the audit log's consumer's reconciliation mark
// (ops.MarkedSource).
func (s AuditLogSeen) SeenMark(ctx context.Context) (ops.SeenMark, error) {
	return seenMark(ctx, s.Pool, s.Consumer)
}

// SeenSince reads the audit log's rows whose inbox rows changed at or after
// since.
func (s AuditLogSeen) SeenSince(ctx context.Context, since uint64, each func([]ops.SeenEvent) error) error {
	return seenSincePages(ctx, s.Pool, `
WITH page AS (
    SELECT changed_xid, event_id FROM consumer_inbox
    WHERE consumer = $1 AND changed_xid >= $2::text::xid8 AND (changed_xid, event_id) > ($2::text::xid8, $3)
    ORDER BY consumer_inbox.changed_xid, event_id LIMIT $4)
SELECT p.changed_xid::text, p.event_id, a.event_id IS NOT NULL, coalesce(a.type, ''), coalesce(a.aggregate_type, ''),
       coalesce(a.aggregate_id, ''), coalesce(a.revision, 0), coalesce(a.journal_id, ''), coalesce(a.payload::text, ''),
       coalesce(a.idempotency_digest, '')
FROM page AS p LEFT JOIN audit_log AS a ON a.event_id = p.event_id ORDER BY p.changed_xid, p.event_id`,
		s.Consumer, since, func(rows pgx.CollectableRow) (sinceRow, error) {
			var r sinceRow
			var payload, digest string
			if err := rows.Scan(&r.xid, &r.EventID, &r.seen, &r.Type, &r.AggregateType, &r.AggregateID, &r.Revision, &r.JournalID,
				&payload, &digest); err != nil {
				return r, err
			}
			auditPayload(&r.SeenEvent, payload, digest)
			return r, nil
		}, each)
}

// SourceName names the source in reports.
func (AuditLogSeen) SourceName() string { return "audit_log table" }

// Seen reads every event of the audit log, a page at a time in event ID
// order.
func (s AuditLogSeen) Seen(ctx context.Context, each func([]ops.SeenEvent) error) error {
	return seenPages(ctx, s.Pool, `
SELECT event_id, type, aggregate_type, aggregate_id, revision, coalesce(journal_id, ''), payload::text,
       coalesce(idempotency_digest, '') FROM audit_log WHERE event_id > $1 ORDER BY event_id LIMIT $2`,
		nil, func(rows pgx.CollectableRow) (ops.SeenEvent, error) {
			var e ops.SeenEvent
			var payload, digest string
			if err := rows.Scan(&e.EventID, &e.Type, &e.AggregateType, &e.AggregateID, &e.Revision, &e.JournalID, &payload, &digest); err != nil {
				return e, err
			}
			auditPayload(&e, payload, digest)
			return e, nil
		}, each)
}

// auditPayload sets e's payload and idempotency digest from an audit log
// row's.
func auditPayload(e *ops.SeenEvent, payload, digest string) {
	e.Payload = []byte(payload)
	if digest != "" {
		e.Headers = map[string]string{core.HeaderIdempotencyDigest: digest}
	}
}
