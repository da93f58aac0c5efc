package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// ErrNotNewConsumer: a baseline was asked for a consumer that has already
// received events; its state would be overwritten.
var ErrNotNewConsumer = errors.New("the consumer has already received events")

// SetPositions starts a new ordered consumer at a cut: in tx, the consumer
// database's transaction that also writes the consumer's snapshot of the
// same cut, each aggregate's last applied revision becomes its revision at
// the cut. The inbox then counts every later delivery of a revision at or
// below it as a duplicate and applies only later revisions. It refuses a
// consumer with inbox rows or positions already (ErrNotNewConsumer):
// positions move only forward by applying events.
func (in *Inbox) SetPositions(ctx context.Context, tx pgx.Tx, consumer string, positions map[core.AggregateKey]int64) error {
	var used bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM consumer_inbox WHERE consumer = $1)
		OR EXISTS (SELECT 1 FROM consumer_positions WHERE consumer = $1)`, consumer).Scan(&used); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if used {
		return fmt.Errorf("baseline of %s: %w", consumer, ErrNotNewConsumer)
	}
	types, ids, revs := make([]string, 0, len(positions)), make([]string, 0, len(positions)), make([]int64, 0, len(positions))
	for a, rev := range positions {
		if rev < 0 {
			return fmt.Errorf("baseline of %s: %s %s: revision %d is negative", consumer, a.Type, a.ID, rev)
		}
		types, ids, revs = append(types, a.Type), append(ids, a.ID), append(revs, rev)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id, last_revision)
		SELECT $1, t, i, r FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(t, i, r)`, consumer, types, ids, revs); err != nil {
		return fmt.Errorf("baseline of %s: positions: %w", consumer, err)
	}
	return nil
}

// BalancesAtCut is the ledger at one cut: every account's revision and
// balances, read in one snapshot, so each balance is the sum of exactly
// the account's events up to its revision.
type BalancesAtCut struct {
	Revisions map[string]int64
	Balances  []AccountBalance
}

// AccountBalance is one account's balance in one currency.
type AccountBalance struct {
	Account, Currency string
	Balance           int64
}

// ReadBalancesAtCut reads the ledger's balances and account revisions in
// one REPEATABLE READ snapshot (a posting moves both in one transaction).
func ReadBalancesAtCut(ctx context.Context, ledger *pgxpool.Pool) (BalancesAtCut, error) {
	cut := BalancesAtCut{Revisions: map[string]int64{}}
	err := pgx.BeginTxFunc(ctx, ledger, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, revision FROM accounts WHERE revision > 0`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var rev int64
			if err := rows.Scan(&id, &rev); err != nil {
				return err
			}
			cut.Revisions[id] = rev
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT account_id, currency, balance FROM account_balances ORDER BY account_id, currency`)
		if err != nil {
			return err
		}
		cut.Balances, err = pgx.CollectRows(rows, pgx.RowToStructByPos[AccountBalance])
		return err
	})
	if err != nil {
		return BalancesAtCut{}, fmt.Errorf("baseline: read the ledger's balances: %w", err)
	}
	return cut, nil
}

// BaselineProjection starts the balance projection (consumer, the example
// consumer's name) at cut: its balances and positions in one transaction
// of the consumer database, so it applies only the events after the cut.
func BaselineProjection(ctx context.Context, consumerDB *pgxpool.Pool, consumer string, cut BalancesAtCut) error {
	in := NewInbox(consumerDB)
	return pgx.BeginFunc(ctx, consumerDB, func(tx pgx.Tx) error {
		positions := make(map[core.AggregateKey]int64, len(cut.Revisions))
		for acc, rev := range cut.Revisions {
			positions[core.AggregateKey{Type: core.AggregateAccount, ID: acc}] = rev
		}
		if err := in.SetPositions(ctx, tx, consumer, positions); err != nil {
			return err
		}
		accounts, currencies, balances, revisions := make([]string, len(cut.Balances)), make([]string, len(cut.Balances)), make([]int64, len(cut.Balances)), make([]int64, len(cut.Balances))
		for i, b := range cut.Balances {
			accounts[i], currencies[i], balances[i], revisions[i] = b.Account, b.Currency, b.Balance, cut.Revisions[b.Account]
		}
		var existing int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM projection_balances`).Scan(&existing); err != nil {
			return err
		}
		if existing > 0 {
			return fmt.Errorf("baseline of %s: %w (projection_balances holds %d rows)", consumer, ErrNotNewConsumer, existing)
		}
		_, err := tx.Exec(ctx, `INSERT INTO projection_balances (account, currency, balance, revision)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])`, accounts, currencies, balances, revisions)
		return err
	})
}
