package opsstore

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// snapshotID is the shape of pg_export_snapshot's answer, checked before
// it is written into SET TRANSACTION SNAPSHOT (which takes no parameter).
var snapshotID = regexp.MustCompile(`^[0-9A-Fa-f-]{1,64}$`)

// LedgerReader opens an ops.LedgerReader in the cut's snapshot: a second
// read-only REPEATABLE READ transaction that imports the cut's exported
// snapshot, so the ledger proof reads exactly what the cut reads, on its
// own connection, while the cut streams its rows.
func (c *cutSnapshot) LedgerReader(ctx context.Context) (ops.LedgerReader, error) {
	if !snapshotID.MatchString(c.snapshot) {
		return nil, fmt.Errorf("ledger proof: unexpected snapshot id %q", c.snapshot)
	}
	// The cut holds one connection until it closes; a pool of one would
	// wait here for ever.
	if n := c.pool.Config().MaxConns; n < 2 {
		return nil, fmt.Errorf("ledger proof: the ledger pool has %d connection(s); reconciliation needs 2 (the cut's and the proof's)", n)
	}
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("ledger proof: %w", err)
	}
	if _, err := tx.Exec(ctx, `SET TRANSACTION SNAPSHOT '`+c.snapshot+`'`); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("ledger proof: import the cut's snapshot: %w", err)
	}
	// The proof hashes every journal line once, like the cut's reads.
	if _, err := tx.Exec(ctx, `SELECT set_config('work_mem', $1, true)`, cutWorkMem); err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("ledger proof: %w", err)
	}
	return &ledgerSnapshot{tx: tx}, nil
}

// ledgerSnapshot is an ops.LedgerReader.
type ledgerSnapshot struct{ tx pgx.Tx }

func (l *ledgerSnapshot) Close() { _ = l.tx.Rollback(context.Background()) }

// signedAmount is a journal line's amount signed as balances are: credit
// positive (alias l).
const signedAmount = `CASE WHEN l.direction = 'credit' THEN l.amount ELSE -l.amount END`

// JournalDrift implements ops.LedgerReader: one pass over the journal
// lines, summed per account and currency, held against account_balances
// and, rolled up per account, against account_revisions (the lines'
// newest, unless a floor was raised past them).
func (l *ledgerSnapshot) JournalDrift(ctx context.Context) (ops.JournalDrift, error) {
	var d ops.JournalDrift
	if err := l.tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM account_balances)`).
		Scan(&d.Accounts, &d.Balances); err != nil {
		return d, fmt.Errorf("journal drift: %w", err)
	}
	rows, err := l.tx.Query(ctx, `
WITH per AS MATERIALIZED (
    SELECT l.account_id, l.currency, sum(`+signedAmount+`) AS total, count(*) AS n, max(l.revision) AS mx
    FROM journal_lines l GROUP BY l.account_id, l.currency),
acc AS (SELECT account_id, sum(n)::bigint AS n, max(mx) AS mx FROM per GROUP BY account_id)
SELECT true, coalesce(b.account_id, p.account_id), coalesce(b.currency, p.currency),
       coalesce(b.balance::text, ''), coalesce(p.total::text, ''), 0::bigint, 0::bigint, 0::bigint, false
FROM account_balances b FULL JOIN per p ON p.account_id = b.account_id AND p.currency = b.currency
WHERE coalesce(b.balance, 0) <> coalesce(p.total, 0)
UNION ALL
SELECT false, coalesce(a.id, r.account_id), '', '', '', coalesce(a.revision, 0), coalesce(r.n, 0), coalesce(r.mx, 0), a.id IS NULL
FROM account_revisions a FULL JOIN acc r ON r.account_id = a.id
WHERE coalesce(a.revision, 0) <> coalesce(r.mx, 0) OR coalesce(r.n, 0) <> coalesce(r.mx, 0)
ORDER BY 2, 3`)
	if err != nil {
		return d, fmt.Errorf("journal drift: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var balance bool
		var b ops.BalanceDrift
		var r ops.RevisionDrift
		if err := rows.Scan(&balance, &b.Account, &b.Currency, &b.Balance, &b.Lines, &r.Revision, &r.Lines, &r.MaxRevision, &r.NoAccount); err != nil {
			return d, fmt.Errorf("journal drift: %w", err)
		}
		if balance {
			d.Balance = append(d.Balance, b)
		} else {
			r.Account = b.Account
			d.Revision = append(d.Revision, r)
		}
	}
	if err := rows.Err(); err != nil {
		return d, fmt.Errorf("journal drift: %w", err)
	}
	return d, nil
}

// AccountEvents implements ops.LedgerReader: every outbox row of the
// ledger's aggregate with the journal line of its account revision, found
// through the lines' unique (account_id, revision).
func (l *ledgerSnapshot) AccountEvents(ctx context.Context, batch int, fn func([]ops.AccountEvent) error) error {
	rows, err := l.tx.Query(ctx, `
SELECT o.event_id::text, o.kind, o.type, o.aggregate_id, o.revision, coalesce(o.journal_id::text, ''), o.payload,
       l.journal_id::text, l.currency, `+signedAmount+`
FROM outbox o LEFT JOIN journal_lines l ON l.account_id = o.aggregate_id AND l.revision = o.revision
WHERE o.aggregate_type = $1`, core.AggregateAccount)
	if err != nil {
		return fmt.Errorf("account events: %w", err)
	}
	defer rows.Close()
	batch = max(batch, 1)
	out := make([]ops.AccountEvent, 0, batch)
	for rows.Next() {
		var e ops.AccountEvent
		var journal, currency *string
		var delta *int64
		if err := rows.Scan(&e.EventID, &e.Kind, &e.Type, &e.Account, &e.Revision, &e.JournalID, &e.Payload, &journal, &currency, &delta); err != nil {
			return fmt.Errorf("account events: %w", err)
		}
		if journal != nil {
			e.Line = &ops.LineAmount{JournalID: *journal, Currency: *currency, Delta: *delta}
		}
		if out = append(out, e); len(out) == batch {
			if err := fn(out); err != nil {
				return err
			}
			out = make([]ops.AccountEvent, 0, batch)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("account events: %w", err)
	}
	if len(out) > 0 {
		return fn(out)
	}
	return nil
}

// LineSums implements ops.LedgerReader: per row, the account's lines in
// its currency up to its revision, read through the lines' unique
// (account_id, revision).
func (l *ledgerSnapshot) LineSums(ctx context.Context, in []ops.ProjectedBalance) ([]ops.LineSum, error) {
	accounts, currencies, revisions := make([]string, len(in)), make([]string, len(in)), make([]int64, len(in))
	for i, r := range in {
		accounts[i], currencies[i], revisions[i] = r.Account, r.Currency, r.Revision
	}
	out, err := pgrows.Query(ctx, l.tx, pgx.RowToStructByPos[ops.LineSum], `
SELECT coalesce((SELECT sum(`+signedAmount+`) FROM journal_lines l
                 WHERE l.account_id = u.account AND l.currency = u.currency AND l.revision <= u.revision), 0)::text,
       coalesce((SELECT a.revision FROM account_revisions a WHERE a.id = u.account), 0)
FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS u(account, currency, revision, n)
ORDER BY u.n`, accounts, currencies, revisions)
	if err != nil {
		return nil, fmt.Errorf("line sums: %w", err)
	}
	return out, nil
}

// BalanceView reads a consumer's balance view (reconcile.consumers[].
// balance_view): a table or view with columns account, currency, balance
// (minor units, credit positive) and revision (the account's last
// revision the consumer applied in that currency), like the example
// projection's projection_balances.
type BalanceView struct {
	pool *pgxpool.Pool
	name string
}

var _ ops.BalanceViewReader = (*BalanceView)(nil)

// NewBalanceView returns the reader of the view name in the consumer's
// database; name must satisfy ops.ValidBalanceView.
func NewBalanceView(pool *pgxpool.Pool, name string) (*BalanceView, error) {
	if !ops.ValidBalanceView(name) {
		return nil, fmt.Errorf("balance view %q: want a table or view name, e.g. projection_balances or reporting.balances", name)
	}
	return &BalanceView{pool: pool, name: name}, nil
}

// View implements ops.BalanceViewReader.
func (v *BalanceView) View() string { return v.name }

// ProjectedBalances implements ops.BalanceViewReader.
func (v *BalanceView) ProjectedBalances(ctx context.Context) ([]ops.ProjectedBalance, error) {
	ident := pgx.Identifier(strings.Split(v.name, ".")).Sanitize()
	out, err := pgrows.Query(ctx, v.pool, pgx.RowToStructByPos[ops.ProjectedBalance],
		`SELECT account::text, currency::text, balance::text, revision::bigint FROM `+ident)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", v.name, err)
	}
	return out, nil
}
