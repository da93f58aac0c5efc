package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/core"
)

// PositionSetter starts a new consumer's inbox at a cut, in the consumer
// database's transaction that also writes the consumer's snapshot of it.
type PositionSetter interface {
	SetPositions(ctx context.Context, tx pgx.Tx, consumer string, positions map[core.AggregateKey]int64) error
}

// Baseline starts the projection (consumer, its name) at cut: in tx, its
// balances and its inbox positions, so it applies only the events after
// the cut. It refuses a projection that holds balances already, as the
// inbox refuses a consumer that has received events.
func Baseline(ctx context.Context, tx pgx.Tx, inbox PositionSetter, consumer string, cut core.BalancesAtCut) error {
	positions := make(map[core.AggregateKey]int64, len(cut.Revisions))
	for acc, rev := range cut.Revisions {
		positions[core.AggregateKey{Type: core.AggregateAccount, ID: acc}] = rev
	}
	if err := inbox.SetPositions(ctx, tx, consumer, positions); err != nil {
		return err
	}
	n := len(cut.Balances)
	accounts, currencies, balances, revisions := make([]string, n), make([]string, n), make([]int64, n), make([]int64, n)
	for i, b := range cut.Balances {
		accounts[i], currencies[i], balances[i], revisions[i] = b.Account, b.Currency, b.Balance, cut.Revisions[b.Account]
	}
	var existing int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM projection_balances`).Scan(&existing); err != nil {
		return fmt.Errorf("baseline of %s: %w", consumer, err)
	}
	if existing > 0 {
		return fmt.Errorf("baseline of %s: projection_balances holds %d rows already; a baseline starts a new consumer only", consumer, existing)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO projection_balances (account, currency, balance, revision)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])`, accounts, currencies, balances, revisions); err != nil {
		return fmt.Errorf("baseline of %s: %w", consumer, err)
	}
	return nil
}
