package opsstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// OpenCut proves and opens a cut (see ops.Cut): one read-only REPEATABLE
// READ transaction held until the cut's Close. It returns
// ops.ErrCutNotProvable (wrapped, with the reason) when the cut lies beyond
// the last committed sequence or in-flight transactions did not end within
// req.Settle.
//
// How it is proven. journals.sequence is taken by the posting's last
// statement, so a transaction may hold a smaller sequence than one already
// committed while it is still in flight. OpenCut reads (1) the outbox id
// sequence's last value L, (2) the last committed journal sequence M (and
// the cut N <= M), then (3) the transactions of this database that hold a
// transaction ID, and waits until each of them has ended. A transaction that
// holds a sequence <= N took it before M was committed, so it had its
// transaction ID before (3) and is waited for; likewise any writer of an
// outbox id <= L (a posting writes its accounts before the outbox, so it
// has its transaction ID before taking an outbox id). Only then is the
// snapshot taken, so it contains every journal <= N and every outbox row
// with id <= L that will ever commit.
func (s *Store) OpenCut(ctx context.Context, req ops.CutRequest) (*ops.Cut, error) {
	if req.Settle <= 0 {
		req.Settle = 10 * time.Second
	}
	var limit, last int64
	if err := s.pool.QueryRow(ctx, `
SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_id_seq),
       (SELECT coalesce(max(sequence), 0) FROM journals)`).Scan(&limit, &last); err != nil {
		return nil, fmt.Errorf("open cut: %w", err)
	}
	n := last
	switch {
	case req.Sequence > 0:
		if req.Sequence > last {
			return nil, fmt.Errorf("%w: cut %d is beyond the last committed journal sequence %d", ops.ErrCutNotProvable, req.Sequence, last)
		}
		n = req.Sequence
	case !req.Time.IsZero():
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(sequence), 0) FROM journals WHERE posted_at <= $1`, req.Time).Scan(&n); err != nil {
			return nil, fmt.Errorf("open cut: %w", err)
		}
	}
	start := time.Now()
	if err := s.awaitInFlight(ctx, req.Settle); err != nil {
		return nil, err
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("open cut: %w", err)
	}
	c := &ops.Cut{Sequence: n, LastCommitted: last, OutboxIDLimit: limit, Waited: time.Since(start)}
	// The cut's reads hash and sort the whole cut (the event stream sorts
	// a million rows by id): with 64 MB per sort or hash instead of the
	// server's default 4 MB they stay in memory instead of spilling to
	// disk, for this transaction only. On a million events the
	// reconciliation took 5.3 s instead of 6.7-7.0 s.
	// The snapshot is exported so that the ledger proof reads the same
	// one on a second connection, beside the event stream (LedgerReader).
	var snapshot string
	err = tx.QueryRow(ctx, `
SELECT now(), coalesce((SELECT journal_floor FROM ops_cleanup), 0), coalesce((SELECT deleted_through_id FROM ops_cleanup), 0),
       set_config('work_mem', $1, true), pg_export_snapshot()`,
		cutWorkMem).Scan(&c.TakenAt, &c.Floor, &c.CleanedThroughID, nil, &snapshot)
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("open cut: %w", err)
	}
	c.CutReader = &cutSnapshot{tx: tx, pool: s.pool, snapshot: snapshot, sequence: n, floor: c.Floor, outboxIDLimit: limit, covered: -1}
	return c, nil
}

// cutWorkMem is the cut transaction's work_mem (see OpenCut).
const cutWorkMem = "64MB"

// awaitInFlight waits until every transaction of this database that holds
// a transaction ID now has ended.
func (s *Store) awaitInFlight(ctx context.Context, settle time.Duration) error {
	rows, err := s.pool.Query(ctx, `
SELECT pid, backend_xid::text FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()`)
	if err != nil {
		return fmt.Errorf("open cut: in-flight transactions: %w", err)
	}
	type inflight struct {
		pid int32
		xid string
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inflight, error) {
		var f inflight
		return f, r.Scan(&f.pid, &f.xid)
	})
	if err != nil {
		return fmt.Errorf("open cut: in-flight transactions: %w", err)
	}
	if len(list) == 0 {
		return nil
	}
	pids, xids := make([]int32, len(list)), make([]string, len(list))
	for i, f := range list {
		pids[i], xids[i] = f.pid, f.xid
	}
	deadline := time.Now().Add(settle)
	for wait := 2 * time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		var still []int32
		rows, err := s.pool.Query(ctx, `
SELECT a.pid FROM pg_stat_activity a
JOIN unnest($1::int[], $2::text[]) AS f(pid, xid) ON a.pid = f.pid AND a.backend_xid::text = f.xid`, pids, xids)
		if err == nil {
			still, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		}
		if err != nil {
			return fmt.Errorf("open cut: in-flight transactions: %w", err)
		}
		if len(still) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d transaction(s) of the ledger database still in progress after %s (backend pid %v); "+
				"one of them may commit a journal at or below the cut", ops.ErrCutNotProvable, len(still), settle, still)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// cutSnapshot is an ops.CutReader: the cut's transaction and bounds.
type cutSnapshot struct {
	tx pgx.Tx
	// pool and snapshot (the exported snapshot's ID) open LedgerReader.
	pool                           *pgxpool.Pool
	snapshot                       string
	sequence, floor, outboxIDLimit int64
	// covered is CoveredOutboxID's answer once asked (-1 before).
	covered int64
}

// Close ends the cut's transaction.
func (c *cutSnapshot) Close() { _ = c.tx.Rollback(context.Background()) }

// LinesWithoutEvents returns journal lines of the cut (above the floor)
// that have no ledger.account.posted outbox row of the same account
// revision and journal: up to limit of them, and how many there are.
//
// The anti-join is a MATERIALIZED CTE, planned apart from the LIMIT: under
// the LIMIT the planner expected the first missing lines early and probed
// the outbox's unique index once per line, though counting them reads
// every line anyway. On a cut of a million lines that took 5.0 s; planned
// on its own it is a hash anti-join of 1.2 s.
func (c *cutSnapshot) LinesWithoutEvents(ctx context.Context, limit int) ([]ops.JournalLine, int64, error) {
	limit = max(limit, 1) // the count comes with the rows
	rows, err := c.tx.Query(ctx, `
WITH missing AS MATERIALIZED (
    SELECT j.id, j.sequence, l.line_no, l.account_id, l.revision
    FROM journals j JOIN journal_lines l ON l.journal_id = j.id
    WHERE j.sequence > $1 AND j.sequence <= $2
      AND NOT EXISTS (SELECT 1 FROM outbox o
                      WHERE o.aggregate_type = $3 AND o.aggregate_id = l.account_id AND o.revision = l.revision
                        AND o.journal_id = j.id AND o.kind = 'event'))
SELECT id::text, sequence, account_id, revision, (SELECT count(*) FROM missing)
FROM missing
ORDER BY sequence, line_no
LIMIT $4`, c.floor, c.sequence, core.AggregateAccount, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("lines without events: %w", err)
	}
	var out []ops.JournalLine
	var total int64
	for rows.Next() {
		var l ops.JournalLine
		if err := rows.Scan(&l.JournalID, &l.Sequence, &l.Account, &l.Revision, &total); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("lines without events: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("lines without events: %w", err)
	}
	return out, total, nil
}

// CoveredOutboxID is the largest outbox id X of a row such that every
// outbox row with id <= X is final and belongs to the cut (to a journal
// of the cut, or to none): the first row of a later journal bounds it, and
// so does OutboxIDLimit. X is a row's id, not an id the sequence gave to
// a transaction that rolled back, so that the report names a row.
//
// The first such row is found with min() rather than ORDER BY id LIMIT 1:
// the planner then hashes the later journals once instead of looking up
// each row's journal through its index.
func (c *cutSnapshot) CoveredOutboxID(ctx context.Context) (int64, error) {
	if c.covered >= 0 {
		return c.covered, nil
	}
	var x pgtype.Int8
	err := c.tx.QueryRow(ctx, `
SELECT max(id) FROM outbox
WHERE id <= least($2::bigint, coalesce((SELECT min(o.id) - 1 FROM outbox o JOIN journals j ON j.id = o.journal_id WHERE j.sequence > $1), $2::bigint))`,
		c.sequence, c.outboxIDLimit).Scan(&x)
	if err != nil {
		return 0, fmt.Errorf("covered outbox id: %w", err)
	}
	c.covered = x.Int64
	return c.covered, nil
}

// ExpectedEvents calls fn with the rows of the cut (events and commands),
// in id order, in batches of up to batch: those of the cut's journals above
// the floor, and those of no journal (or of a journal that does not exist)
// up to CoveredOutboxID. One query streams them all: the database joins the
// outbox to the journals once (a hash join and a sort) instead of once per
// batch through the journals' index, which made the read of a million
// events several times slower; fn runs while the next rows arrive.
func (c *cutSnapshot) ExpectedEvents(ctx context.Context, batch int, fn func([]ops.ExpectedEvent) error) error {
	covered, err := c.CoveredOutboxID(ctx)
	if err != nil {
		return err
	}
	rows, err := c.tx.Query(ctx, `
SELECT o.id, o.event_id::text, o.kind, o.topic, coalesce(j.sequence, 0), o.created_at, `+Relayed+`, o.aggregate_type, o.aggregate_id, o.revision
FROM outbox o LEFT JOIN journals j ON j.id = o.journal_id
WHERE CASE WHEN j.id IS NULL THEN o.id <= $3 ELSE j.sequence > $1 AND j.sequence <= $2 END
ORDER BY o.id`, c.floor, c.sequence, covered)
	if err != nil {
		return fmt.Errorf("expected events: %w", err)
	}
	defer rows.Close()
	batch = max(batch, 1)
	out := make([]ops.ExpectedEvent, 0, batch)
	for rows.Next() {
		var e ops.ExpectedEvent
		if err := rows.Scan(&e.ID, &e.EventID, &e.Kind, &e.Topic, &e.Sequence, &e.CreatedAt, &e.Relayed, &e.AggregateType, &e.AggregateID, &e.Revision); err != nil {
			return fmt.Errorf("expected events: %w", err)
		}
		if out = append(out, e); len(out) == batch {
			if err := fn(out); err != nil {
				return err
			}
			out = make([]ops.ExpectedEvent, 0, batch)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("expected events: %w", err)
	}
	if len(out) > 0 {
		return fn(out)
	}
	return nil
}

// UnknownEventIDs returns those of ids that no outbox row carries, read
// now (not in a cut: a consumer may have recorded an event committed after
// the cut's snapshot, and it must not look unknown). An ID that is not a
// UUID is unknown by definition.
func (s *Store) UnknownEventIDs(ctx context.Context, ids []string) ([]string, error) {
	var unknown []string
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil || u.String() != id {
			unknown = append(unknown, id)
			continue
		}
		valid = append(valid, id)
	}
	if len(valid) == 0 {
		return unknown, nil
	}
	more, err := pgrows.Query(ctx, s.pool, pgx.RowTo[string], `
SELECT u FROM unnest($1::text[]) AS u
WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = u::uuid)`, valid)
	if err != nil {
		return nil, fmt.Errorf("unknown event ids: %w", err)
	}
	return append(unknown, more...), nil
}
