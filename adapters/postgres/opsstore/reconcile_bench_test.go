package opsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

// Reconcile measured on 1M events: a ledger of 500,000
// two-line journals (1,000,000 events, all relayed) and two consumers'
// inboxes with an applied row for each. Loading takes about a minute, so
// it runs only when asked, like the retention benchmarks:
//
//	POSTHORN_BENCH_1M=1 go test -run '^$' -bench 'Reconcile1M' -benchtime 1x -timeout 30m ./adapters/postgres/opsstore/
//
// The rows are written set-based (generate_series), in the shape the
// Posting API writes them: journal j has lines on accounts acc-(2j-2 mod
// 10,000) and acc-(2j-1 mod 10,000), each line's event is the outbox row of
// that account revision and journal, IDs are time-ordered like the API's UUIDv7
// and derived from e, so the consumer database (another database) writes
// the same ones.
func BenchmarkReconcile1M(b *testing.B) {
	pgtest.Require1M(b, "loads 1,000,000 rows (minutes)")
	const events = 1_000_000
	ctx := context.Background()
	_, ledger := pgtest.Ledger(b)
	_, consumer := pgtest.Consumer(b)
	loadReconcileLedger(b, ledger, events)
	consumers := []string{"balance-projection", "audit-log"}
	loadInboxes(b, consumer, consumers, events)
	// The projection's balances, its balance view: what the ledger's are.
	exec(b, consumer, `
INSERT INTO projection_balances (account, currency, balance, revision)
SELECT 'acc-' || a, 'EUR', CASE WHEN a % 2 = 0 THEN -7 ELSE 7 END * ($1::int / 10000), $1::int / 10000
FROM generate_series(0, 9999) a`, events)
	exec(b, consumer, `VACUUM ANALYZE consumer_inbox, projection_balances`)
	// The load's writes are flushed now, not by a checkpoint during the
	// measurement.
	exec(b, consumer, `CHECKPOINT`)
	in := inboxstore.New(consumer)
	var sources []ops.ConsumerSource
	for _, c := range consumers {
		sources = append(sources, ops.ConsumerSource{Name: c, Reader: ops.InboxReader{Inbox: in, Consumer: c}})
	}
	view, err := opsstore.NewBalanceView(consumer, "projection_balances")
	if err != nil {
		b.Fatal(err)
	}
	sources[0].BalanceView = view
	store := opsstore.New(ledger)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		rep, err := ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: store, Consumers: sources, Record: true})
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if !rep.Clean || rep.Consumers[0].Expected != events || rep.Consumers[1].Applied != events ||
			rep.Ledger.Events != events || rep.Consumers[0].BalanceView.Compared != 10000 {
			b.Fatalf("reconcile: not clean over %d events: %+v", events, rep)
		}
		fmt.Printf("BenchmarkReconcile1M: %d events, 2 consumers, in %.2fs = %.0f rows/s\n", events, took.Seconds(), events/took.Seconds())
		b.ReportMetric(events/took.Seconds(), "rows/s")
	}
}

// loadReconcileLedger writes events/2 journals of two lines each, their
// accounts and balances, and one relayed outbox event per line with the
// payload the Posting API writes (see BenchmarkReconcile1M). Every line of
// account a is a debit when a is even, a credit when odd, of 7.
func loadReconcileLedger(b testing.TB, pool *pgxpool.Pool, events int) {
	b.Helper()
	exec(b, pool, `INSERT INTO accounts (id, revision) SELECT 'acc-' || a, $1::int / 10000 FROM generate_series(0, 9999) a`, events)
	exec(b, pool, `
INSERT INTO account_opening_balances (account_id, currency, balance)
SELECT 'acc-' || a, 'EUR', 0 FROM generate_series(0, 9999) a`)
	exec(b, pool, `
INSERT INTO journals (id, sequence, posted_at)
SELECT `+v7("j", "'j'")+`, j, now() FROM generate_series(1, $1::int / 2) j`, events)
	exec(b, pool, `SELECT setval('journal_sequence', $1::int / 2)`, events)
	// Event e is line e%2+1 of journal e/2+1: revision e/10000+1 of
	// account acc-(e mod 10,000), so (account, revision) is unique, and
	// its balance after revision r is 7r or -7r.
	exec(b, pool, `
INSERT INTO journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision, balance_after)
SELECT `+v7("(e / 2 + 1)", "'j'")+`, e % 2 + 1, 'acc-' || (e % 10000), CASE WHEN e % 2 = 0 THEN 'debit' ELSE 'credit' END,
       7, 'EUR', e / 10000 + 1, CASE WHEN e % 2 = 0 THEN -7 ELSE 7 END * (e / 10000 + 1)
FROM generate_series(0, $1::int - 1) e`, events)
	exec(b, pool, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, journal_id, payload, occurred_at)
SELECT `+v7("e", "'ev'")+`, 'event', 'ledger.account.posted', 'ledger.events', 'account', 'acc-' || (e % 10000), e / 10000 + 1,
       e % 16, `+v7("(e / 2 + 1)", "'j'")+`,
       convert_to(json_build_object('event_id', `+v7("e", "'ev'")+`, 'journal_id', `+v7("(e / 2 + 1)", "'j'")+`,
           'account', 'acc-' || (e % 10000), 'revision', e / 10000 + 1, 'currency', 'EUR',
           'delta', CASE WHEN e % 2 = 0 THEN '-7' ELSE '7' END, 'posted_at', now())::text, 'UTF8'), now()
FROM generate_series(0, $1::int - 1) e ORDER BY e`, events)
	exec(b, pool, `TRUNCATE outbox_pending`)
	exec(b, pool, `VACUUM ANALYZE accounts, journals, journal_lines, outbox, outbox_pending`)
}

// loadInboxes gives each of consumers an applied inbox row for each of
// the events loadReconcileLedger writes.
func loadInboxes(tb testing.TB, pool *pgxpool.Pool, consumers []string, events int) {
	tb.Helper()
	for _, c := range consumers {
		exec(tb, pool, `
INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
SELECT $1, `+v7("e", "'ev'")+`::text, 'event', 'ledger.account.posted', 'account', 'acc-' || (e % 10000), e / 10000 + 1, 'applied'
FROM generate_series(0, $2::int - 1) e`, c, events)
	}
}

// v7 is an SQL expression of a UUIDv7-shaped ID that sorts by the integer
// expression n, as the Posting API's time-ordered IDs sort by creation;
// salt (an SQL string) keeps two kinds of ID from colliding.
func v7(n, salt string) string {
	return fmt.Sprintf(`(lpad(to_hex(%[1]s), 12, '0') || '7' || substr(md5(%[2]s || %[1]s), 1, 3) || '8' || substr(md5(%[2]s || %[1]s), 4, 15))::uuid`, n, salt)
}

func exec(b testing.TB, pool *pgxpool.Pool, q string, args ...any) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), q, args...); err != nil {
		b.Fatalf("%s: %v", q, fmt.Errorf("load: %w", err))
	}
}
