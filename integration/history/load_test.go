package history

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
)

// accounts is how many accounts the history spreads over: every size is a
// multiple of it, so each account has the same number of revisions.
const accounts = 10_000

// load writes events events of history into a fresh ledger and consumer
// database, set-based, in the shape the Posting API, the relay and the
// example consumers leave them: events/2 journals of two lines each on
// accounts acc-(e mod 10,000) (line e is a debit of 7 EUR when e is even,
// a credit when odd), their idempotency keys, the accounts' revisions and
// balances, one outbox row per line with the payload and digest header
// the API writes, all relayed (no outbox_pending row); on the consumer
// side an applied inbox row per event for both example consumers, the
// audit log's row per event, the projection's balances and its positions.
// Event, journal and key IDs derive from e, so both databases name the
// same events. With events 0 only the accounts exist (revision 0): the
// empty database that the figures are divided by differs from the loaded
// one in history alone. The two databases load concurrently; both are
// vacuumed and analyzed and a checkpoint flushes the load's writes, so
// the measurement pays for none of it.
func load(b *testing.B, ledger, consumer *pgxpool.Pool, events int) {
	b.Helper()
	if events%accounts != 0 {
		b.Fatalf("history: %d events, want a multiple of %d (the accounts)", events, accounts)
	}
	ctx := context.Background()
	ledgerSQL, consumerSQL := []string{ledgerAccounts}, []string(nil)
	if events > 0 {
		ledgerSQL, consumerSQL = append(ledgerSQL, ledgerHistory...), consumerHistory
	}
	var wg sync.WaitGroup
	var ledgerErr, consumerErr error
	wg.Go(func() { ledgerErr = run(ctx, ledger, ledgerSQL, events) })
	wg.Go(func() { consumerErr = run(ctx, consumer, consumerSQL, events) })
	wg.Wait()
	if ledgerErr != nil {
		b.Fatalf("load the ledger: %v", ledgerErr)
	}
	if consumerErr != nil {
		b.Fatalf("load the consumer database: %v", consumerErr)
	}
	for _, p := range []*pgxpool.Pool{ledger, consumer} {
		if _, err := p.Exec(ctx, `VACUUM ANALYZE`); err != nil {
			b.Fatalf("vacuum after the load: %v", err)
		}
	}
	if _, err := ledger.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Fatalf("checkpoint after the load: %v", err)
	}
}

// run executes the statements in order, with @events the event count and
// @accounts the account count.
func run(ctx context.Context, pool *pgxpool.Pool, statements []string, events int) error {
	for _, q := range statements {
		if _, err := pool.Exec(ctx, q, pgx.NamedArgs{"events": events, "accounts": accounts}); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// ledgerAccounts creates the accounts at the revision the history leaves
// them (0 with no events).
const ledgerAccounts = `INSERT INTO accounts (id, revision) SELECT 'acc-' || a, @events::int / @accounts::int FROM generate_series(0, @accounts::int - 1) a`

// ledgerHistory writes the ledger's history, after ledgerAccounts. Account
// a's outbox rows are in the shard the write path gives it (posthorn.shard
// is core.ShardOf), so its new rows land beside its old ones.
var ledgerHistory = []string{
	`INSERT INTO account_opening_balances (account_id, currency, balance)
SELECT 'acc-' || a, 'EUR', 0 FROM generate_series(0, @accounts::int - 1) a`,
	`INSERT INTO journals (id, sequence, posted_at) SELECT ` + v7("j", "'j'") + `, j, now() FROM generate_series(1, @events::int / 2) j`,
	`SELECT setval('journal_sequence', @events::int / 2)`,
	// Event e is line e%2+1 of journal e/2+1: revision e/accounts+1 of
	// account acc-(e mod accounts), so (account, revision) is unique; with
	// an even number of accounts, an account's lines are all debits or all
	// credits, and its balance after revision r is 7r or -7r.
	`INSERT INTO journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision, balance_after)
SELECT ` + v7("(e / 2 + 1)", "'j'") + `, e % 2 + 1, 'acc-' || (e % @accounts::int), CASE WHEN e % 2 = 0 THEN 'debit' ELSE 'credit' END,
       7, 'EUR', e / @accounts::int + 1, CASE WHEN e % 2 = 0 THEN -7 ELSE 7 END * (e / @accounts::int + 1)
FROM generate_series(0, @events::int - 1) e`,
	`INSERT INTO idempotency_keys (key, request_hash, journal_id, response)
SELECT 'history-' || j, sha256(convert_to('history-' || j, 'UTF8')), ` + v7("j", "'j'") + `,
       jsonb_build_object('journal_id', ` + v7("j", "'j'") + `, 'sequence', j, 'commands', '[]'::jsonb, 'events', jsonb_build_array(
           jsonb_build_object('event_id', ` + v7("(2 * j - 2)", "'ev'") + `, 'account', 'acc-' || ((2 * j - 2) % @accounts::int), 'revision', (2 * j - 2) / @accounts::int + 1),
           jsonb_build_object('event_id', ` + v7("(2 * j - 1)", "'ev'") + `, 'account', 'acc-' || ((2 * j - 1) % @accounts::int), 'revision', (2 * j - 1) / @accounts::int + 1)))
FROM generate_series(1, @events::int / 2) j`,
	`WITH acc AS MATERIALIZED (SELECT a, 'acc-' || a AS id, posthorn.shard('acc-' || a) AS shard FROM generate_series(0, @accounts::int - 1) a)
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, journal_id, headers, payload, occurred_at)
SELECT ` + v7("e", "'ev'") + `, 'event', 'ledger.account.posted', 'ledger.events', 'account', acc.id, e / @accounts::int + 1,
       acc.shard, ` + v7("(e / 2 + 1)", "'j'") + `, jsonb_build_object('idempotency_digest', ` + digest("(e / 2 + 1)") + `),
       convert_to(` + payload + `::text, 'UTF8'), now()
FROM generate_series(0, @events::int - 1) e JOIN acc ON acc.a = e % @accounts::int
ORDER BY e`,
	// The outbox's trigger queued every row; the history is relayed.
	`TRUNCATE outbox_pending`,
}

// consumerHistory writes what both example consumers hold after applying
// the ledger's history. With no events there is nothing: balance-projection
// creates an account's position and balance on its first event.
var consumerHistory = []string{
	`INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id, last_revision)
SELECT '` + projection.Name + `', 'account', 'acc-' || a, @events::int / @accounts::int FROM generate_series(0, @accounts::int - 1) a`,
	`INSERT INTO projection_balances (account, currency, balance, revision)
SELECT 'acc-' || a, 'EUR', CASE WHEN a % 2 = 0 THEN -7 ELSE 7 END * (@events::int / @accounts::int), @events::int / @accounts::int
FROM generate_series(0, @accounts::int - 1) a`,
	inboxLoad(projection.Name),
	inboxLoad(auditlog.Name),
	`INSERT INTO audit_log (event_id, type, aggregate_type, aggregate_id, revision, journal_id, occurred_at, payload, idempotency_digest)
SELECT ` + v7("e", "'ev'") + `::text, 'ledger.account.posted', 'account', 'acc-' || (e % @accounts::int), e / @accounts::int + 1,
       ` + v7("(e / 2 + 1)", "'j'") + `::text, now(), ` + payload + `::jsonb, ` + digest("(e / 2 + 1)") + `
FROM generate_series(0, @events::int - 1) e`,
}

// inboxLoad is consumer's applied inbox row of every event (an applied row
// keeps neither headers nor payload).
func inboxLoad(consumer string) string {
	return `INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
SELECT '` + consumer + `', ` + v7("e", "'ev'") + `::text, 'event', 'ledger.account.posted', 'account', 'acc-' || (e % @accounts::int), e / @accounts::int + 1, 'applied'
FROM generate_series(0, @events::int - 1) e`
}

// payload is event e's ledger.account.posted payload, as the Posting API
// writes it (a json value; e and @accounts in scope).
var payload = `json_build_object('event_id', ` + v7("e", "'ev'") + `, 'journal_id', ` + v7("(e / 2 + 1)", "'j'") + `,
           'account', 'acc-' || (e % @accounts::int), 'revision', e / @accounts::int + 1, 'currency', 'EUR',
           'delta', CASE WHEN e % 2 = 0 THEN '-7' ELSE '7' END, 'posted_at', now())`

// v7 is an SQL expression of a UUIDv7-shaped ID that sorts by the integer
// expression n, as the Posting API's time-ordered IDs sort by creation;
// salt (an SQL string) keeps two kinds of ID from colliding.
func v7(n, salt string) string {
	return fmt.Sprintf(`(lpad(to_hex(%[1]s), 12, '0') || '7' || substr(md5(%[2]s || %[1]s), 1, 3) || '8' || substr(md5(%[2]s || %[1]s), 4, 15))::uuid`, n, salt)
}

// digest is an SQL expression of journal j's idempotency digest in the
// header's shape (43 base64url characters), derived from its key.
func digest(j string) string {
	return fmt.Sprintf(`rtrim(translate(encode(sha256(convert_to('history-' || %s, 'UTF8')), 'base64'), '+/', '-_'), '=')`, j)
}
