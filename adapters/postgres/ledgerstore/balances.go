package ledgerstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// ReadBalancesAtCut reads the ledger's balances and account revisions in
// one REPEATABLE READ snapshot (a posting moves both in one transaction).
func ReadBalancesAtCut(ctx context.Context, ledger *pgxpool.Pool) (core.BalancesAtCut, error) {
	cut := core.BalancesAtCut{Revisions: map[string]int64{}}
	err := pgx.BeginTxFunc(ctx, ledger, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, revision FROM account_revisions WHERE revision > 0`)
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
		cut.Balances, err = pgx.CollectRows(rows, pgx.RowToStructByPos[core.AccountBalance])
		return err
	})
	if err != nil {
		return core.BalancesAtCut{}, fmt.Errorf("baseline: read the ledger's balances: %w", err)
	}
	return cut, nil
}
