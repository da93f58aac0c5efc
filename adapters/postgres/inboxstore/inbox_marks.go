package inboxstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/ops"
)

// Reconciliation's marks (consumer migration 00009, ops/reconcile_marks.go):
// every inbox row carries the transaction ID of its last change, and a clean
// pass records the xmin of a snapshot taken before it read. Transaction IDs
// travel as text: xid8 is a 64-bit counter that never wraps.

// BeginPass implements ops.IncrementalReader for consumer: the mark a pass
// starting now records if clean, and the recorded one it may read from,
// all in one statement so that the mark is taken before any read.
func (in *Inbox) BeginPass(ctx context.Context, consumer, ledgerHistory string) (ops.PassStart, error) {
	var (
		next, server                  string
		mark, markServer, markHistory *string
	)
	err := in.pool.QueryRow(ctx, `
SELECT pg_snapshot_xmin(pg_current_snapshot())::text, (SELECT system_identifier FROM pg_control_system())::text,
       m.mark::text, m.server::text, m.ledger_history
FROM (SELECT 1) AS one LEFT JOIN consumer_reconciled AS m ON m.consumer = $1`, consumer).Scan(&next, &server, &mark, &markServer, &markHistory)
	if err != nil {
		return ops.PassStart{}, fmt.Errorf("inbox: begin a reconciliation pass: %w%s", err, markHint(err))
	}
	var p ops.PassStart
	if p.Next, err = strconv.ParseUint(next, 10, 64); err != nil {
		return p, fmt.Errorf("inbox: snapshot xmin %q: %w", next, err)
	}
	switch {
	case mark == nil:
		p.Why = "no clean pass has recorded a mark yet"
	case *markServer != server:
		p.Why = "the mark was recorded on another database server (restored from a dump?)"
	case *markHistory != ledgerHistory:
		p.Why = fmt.Sprintf("the mark was proven against another ledger history (%s, now %s)", *markHistory, ledgerHistory)
	default:
		since, err := strconv.ParseUint(*mark, 10, 64)
		if err != nil {
			return p, fmt.Errorf("inbox: mark %q: %w", *mark, err)
		}
		// A mark is the xmin of an earlier snapshot on this server, which
		// the xmin of a later one never falls below.
		if since > p.Next {
			p.Why = fmt.Sprintf("the mark %d lies ahead of this server's oldest running transaction %d", since, p.Next)
			break
		}
		p.Since = since
	}
	return p, nil
}

// InboxEventIDsSince calls fn with the event IDs of consumer's rows changed
// at or after since, in batches of up to batch: a short statement a page,
// in the order of the index on (consumer, changed_xid, event_id), so that
// a page reads its rows and stops. A row changed again while the pages are
// read may come twice.
func (in *Inbox) InboxEventIDsSince(ctx context.Context, consumer string, since uint64, batch int, fn func(ids []string) error) error {
	type row struct {
		XID     string
		EventID string
	}
	afterXID, afterID, first := strconv.FormatUint(since, 10), "", true
	for {
		rows, err := pgrows.Query(ctx, in.pool, pgx.RowToStructByPos[row], `
SELECT changed_xid::text AS xid, event_id FROM consumer_inbox
WHERE consumer = $1 AND changed_xid >= $2::text::xid8 AND ($5 OR (changed_xid, event_id) > ($2::text::xid8, $3))
ORDER BY consumer_inbox.changed_xid, event_id LIMIT $4`, consumer, afterXID, afterID, batch, first)
		if err != nil {
			return fmt.Errorf("inbox event ids since %d: %w", since, err)
		}
		if len(rows) == 0 {
			return nil
		}
		ids := make([]string, len(rows))
		for i, r := range rows {
			ids[i] = r.EventID
		}
		if err := fn(ids); err != nil {
			return err
		}
		last := rows[len(rows)-1]
		afterXID, afterID, first = last.XID, last.EventID, false
	}
}

// AppliedTwiceSince is AppliedTwice for the revisions where a row of
// consumer changed at or after since is applied: a revision applied twice
// has a second applied row, written (or turned applied) after the first.
// Each such revision's rows are looked up by the index on the aggregate and
// revision, so the cost follows the changed rows, not the inbox.
//
// The lookups are a LATERAL aggregate, so each is one index probe, and the
// disposition is tested as "IS TRUE", which no index can answer: on an
// inbox not yet analysed the planner rates the index on (consumer,
// disposition) as cheap as the one on the revision, and took it to scan
// every applied row once per changed revision (7.7 s on 22,000 rows and
// 2,000 changes, against 17 ms this way).
func (in *Inbox) AppliedTwiceSince(ctx context.Context, consumer string, since uint64) ([][]string, error) {
	out, err := pgrows.Query(ctx, in.pool, pgx.RowTo[[]string], appliedTwiceSinceSQL, consumer, strconv.FormatUint(since, 10))
	if err != nil {
		return nil, fmt.Errorf("applied twice since %d: %w", since, err)
	}
	return out, nil
}

const appliedTwiceSinceSQL = `
SELECT g.ids
FROM (SELECT DISTINCT aggregate_type, aggregate_id, revision FROM consumer_inbox
      WHERE consumer = $1 AND changed_xid >= $2::text::xid8 AND (disposition = 'applied') IS TRUE AND revision > 0) AS k,
LATERAL (SELECT array_agg(o.event_id ORDER BY o.event_id) AS ids, count(*) AS n FROM consumer_inbox AS o
         WHERE o.consumer = $1 AND o.aggregate_type = k.aggregate_type AND o.aggregate_id = k.aggregate_id
           AND o.revision = k.revision AND (o.disposition = 'applied') IS TRUE) AS g
WHERE g.n > 1`

// RecordMark records mark as where consumer's next pass proven against
// ledgerHistory may start, with this server's identity and the ledger's
// witness of the pass (none when witness is ""). It is the one write
// reconciliation makes in a consumer's database, in a read-write
// transaction of its own (its sessions are read-only by default).
func (in *Inbox) RecordMark(ctx context.Context, consumer string, mark uint64, ledgerHistory, witness string) error {
	err := pgx.BeginTxFunc(ctx, in.pool, pgx.TxOptions{AccessMode: pgx.ReadWrite}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
INSERT INTO consumer_reconciled (consumer, mark, server, ledger_history, ledger_witness)
VALUES ($1, $2::text::xid8, (SELECT system_identifier FROM pg_control_system()), $3, nullif($4, '')::uuid)
ON CONFLICT (consumer) DO UPDATE
   SET mark = EXCLUDED.mark, server = EXCLUDED.server, ledger_history = EXCLUDED.ledger_history,
       ledger_witness = EXCLUDED.ledger_witness, recorded_at = now()`,
			consumer, strconv.FormatUint(mark, 10), ledgerHistory, witness)
		return err
	})
	if err != nil {
		return fmt.Errorf("inbox: record the reconciliation mark of %s: %w%s", consumer, err, markHint(err))
	}
	return nil
}

// markHint says what an upgraded consumer database lacks when the marks'
// table is missing (its migration) or closed to the reconciler (its grants).
func markHint(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "42P01": // undefined_table
		return " (run posthorn migrate --consumer: consumer_reconciled is missing)"
	case "42501": // insufficient_privilege
		return " (run posthorn migrate --consumer --roles: posthorn_reconciler reads and writes its marks in consumer_reconciled)"
	}
	return ""
}
