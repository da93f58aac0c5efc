// Package projection is the example consumer balance-projection: it keeps
// each account's balance per currency in the consumer's own database
// (table projection_balances, whose migrations it keeps beside it: Tables).
//
// A balance is a running sum, so the handler depends on its predecessor:
// it is registered with consumers.DependsOnPredecessor, and the inbox
// applies each account's ledger.account.posted events exactly once and in
// revision order. Its balances then equal the ledger's account_balances.
package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// Name is the consumer name (its inbox rows and Kafka consumer group).
const Name = "balance-projection"

// BalanceView is the table of its balances, with the columns a balance
// view declares to reconciliation (reconcile.consumers[].balance_view):
// account, currency, balance and revision.
const BalanceView = "projection_balances"

// Register adds the projection to reg for the events on topic.
func Register(reg *consumers.Registry, topic string, opts ...consumers.Option) error {
	return reg.AddEventHandler(Name, topic, Handle,
		append([]consumers.Option{consumers.DependsOnPredecessor(), consumers.WithBatchHandler(HandleBatch)}, opts...)...)
}

// posted decodes and checks one ledger.account.posted event (ok false: an
// event of another type, which has no effect).
func posted(e core.Envelope) (p core.AccountPosted, ok bool, err error) {
	if e.Type != core.TypeAccountPosted {
		return p, false, nil
	}
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return p, false, consumers.Permanent(fmt.Errorf("payload of %s: %w", e.EventID, err))
	}
	if p.Account != e.AggregateID || p.Revision != e.Revision {
		return p, false, consumers.Permanent(fmt.Errorf("payload of %s names account %q revision %d, headers %q revision %d",
			e.EventID, p.Account, p.Revision, e.AggregateID, e.Revision))
	}
	if _, err := strconv.ParseInt(p.Delta, 10, 64); err != nil || p.Currency == "" {
		return p, false, consumers.Permanent(fmt.Errorf("payload of %s: delta %q currency %q", e.EventID, p.Delta, p.Currency))
	}
	return p, true, nil
}

// HandleBatch is Handle for a run of events in one statement: the deltas of
// each account and currency are summed and added at once, and its revision
// becomes the last one of the run (the inbox gives an account's events in
// revision order).
func HandleBatch(ctx context.Context, tx pgx.Tx, es []core.Envelope) error {
	var accounts, currencies, deltas []string
	var revisions []int64
	for _, e := range es {
		p, ok, err := posted(e)
		if err != nil {
			return err
		}
		if ok {
			accounts, currencies = append(accounts, p.Account), append(currencies, p.Currency)
			deltas, revisions = append(deltas, p.Delta), append(revisions, p.Revision)
		}
	}
	if len(accounts) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO projection_balances (account, currency, balance, revision)
		SELECT account, currency, sum(delta::numeric), max(revision)
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS u(account, currency, delta, revision)
		GROUP BY account, currency
		ORDER BY account, currency
		ON CONFLICT (account, currency) DO UPDATE
		   SET balance = projection_balances.balance + EXCLUDED.balance,
		       revision = EXCLUDED.revision, updated_at = now()`,
		accounts, currencies, deltas, revisions)
	return err
}

// Handle applies one event: a ledger.account.posted adds its signed delta
// to the account's balance in its currency; other event types are
// acknowledged without effect. A payload that can never be applied is a
// permanent error (the event is parked as poison).
func Handle(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
	p, ok, err := posted(e)
	if !ok {
		return err
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO projection_balances (account, currency, balance, revision) VALUES ($1, $2, $3::numeric, $4)
		ON CONFLICT (account, currency) DO UPDATE
		   SET balance = projection_balances.balance + EXCLUDED.balance,
		       revision = EXCLUDED.revision, updated_at = now()`,
		p.Account, p.Currency, p.Delta, p.Revision)
	return err
}

// Querier runs a query on the consumers' database; a *pgxpool.Pool is one.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Balances reads every projected balance: account → currency → minor units.
func Balances(ctx context.Context, pool Querier) (map[string]map[string]*big.Int, error) {
	rows, err := pool.Query(ctx, `SELECT account, currency, balance::text FROM projection_balances`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]map[string]*big.Int)
	for rows.Next() {
		var acc, cur, bal string
		if err := rows.Scan(&acc, &cur, &bal); err != nil {
			return nil, err
		}
		v, ok := new(big.Int).SetString(bal, 10)
		if !ok {
			return nil, fmt.Errorf("balance of %s %s: %q", acc, cur, bal)
		}
		if out[acc] == nil {
			out[acc] = make(map[string]*big.Int)
		}
		out[acc][cur] = v
	}
	return out, rows.Err()
}
