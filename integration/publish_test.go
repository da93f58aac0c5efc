package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/publish"
)

const walletTopic = "events.wallet"

// writer is one way a team's service publishes in its own transaction:
// the Go library on a pgx.Tx or on a database/sql *sql.Tx, or the SQL
// function posthorn_publish.
type writer struct {
	name string
	// begin opens a transaction on pool and returns its publish and end
	// (commit true, or roll back) functions and its backend's PID.
	begin func(t *testing.T, pool *pgxpool.Pool) (pub func(publish.Message) (publish.Published, error), end func(commit bool) error, pid int)
}

var writers = []writer{
	{"go library on pgx", pgxWriter(func(ctx context.Context, tx pgx.Tx, m publish.Message) (publish.Published, error) {
		return publish.Pgx(tx).Event(ctx, m)
	})},
	{"go library on database/sql", func(t *testing.T, pool *pgxpool.Pool) (func(publish.Message) (publish.Published, error), func(bool) error, int) {
		ctx := context.Background()
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = db.Close() })
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		pid := backendPID(t, tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`))
		return func(m publish.Message) (publish.Published, error) { return publish.StdSQL(tx).Event(ctx, m) },
			func(commit bool) error { return endStdSQL(tx, commit) }, pid
	}},
	{"sql function posthorn_publish", pgxWriter(sqlPublish)},
}

// pgxWriter is a writer's begin on a pgx transaction that publishes with
// pub.
func pgxWriter(pub func(context.Context, pgx.Tx, publish.Message) (publish.Published, error)) func(*testing.T, *pgxpool.Pool) (func(publish.Message) (publish.Published, error), func(bool) error, int) {
	return func(t *testing.T, pool *pgxpool.Pool) (func(publish.Message) (publish.Published, error), func(bool) error, int) {
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		pid := backendPID(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`))
		return func(m publish.Message) (publish.Published, error) { return pub(ctx, tx, m) },
			func(commit bool) error { return endPgx(ctx, tx, commit) }, pid
	}
}

func backendPID(t *testing.T, row interface{ Scan(...any) error }) int {
	t.Helper()
	var pid int
	if err := row.Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func endPgx(ctx context.Context, tx pgx.Tx, commit bool) error {
	if commit {
		return tx.Commit(ctx)
	}
	return tx.Rollback(ctx)
}

func endStdSQL(tx *sql.Tx, commit bool) error {
	if commit {
		return tx.Commit()
	}
	return tx.Rollback()
}

// sqlPublish calls posthorn_publish as a psql or JDBC caller would.
func sqlPublish(ctx context.Context, tx pgx.Tx, m publish.Message) (publish.Published, error) {
	headers := "{}"
	if len(m.Headers) > 0 {
		var parts []string
		for k, v := range m.Headers {
			parts = append(parts, fmt.Sprintf("%q:%q", k, v))
		}
		headers = "{" + strings.Join(parts, ",") + "}"
	}
	var want *int64
	if m.Revision != 0 {
		want = &m.Revision
	}
	var p publish.Published
	err := tx.QueryRow(ctx, `SELECT event_id::text, revision FROM posthorn_publish($1, $2, $3, $4::text::jsonb, $5::text::jsonb, $6)`,
		m.AggregateType, m.AggregateID, m.Type, string(m.Payload), headers, want).Scan(&p.EventID, &p.Revision)
	p.Topic = walletTopic
	return p, err
}

func wallet(id string, rev int64) publish.Message {
	return publish.Message{AggregateType: "wallet", AggregateID: id, Type: "wallet.credited",
		Payload: fmt.Appendf(nil, `{"wallet":%q,"amount":"1.00"}`, id), Revision: rev}
}

// TestPublishTransactionIDInversionKeepsRevisionOrder is the ledger path's
// deterministic inversion (relay/polling's TestTransactionIDInversionKeepsRevisionOrder)
// run through each writer: T2 takes its transaction ID first (a write on
// wallet B), T1 publishes revision 1 of wallet A, T2 publishes revision 2
// of A, which waits for T1's aggregate lock, and commits after T1. So
// revision 2 has the smaller transaction ID, yet the relay delivers A's
// revisions in order. Control: a writer that inserts outbox rows with its
// own revisions and no lock (T2's revision 2 goes in and commits while T1
// still holds revision 1) inverts them: the relay delivers 2 before 1.
func TestPublishTransactionIDInversionKeepsRevisionOrder(t *testing.T) {
	t.Parallel()
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			_, pool := pgtest.Ledger(t)
			pub2, end2, pid2 := w.begin(t, pool)
			mustPublish(t, pub2, wallet("B", 0))
			pub1, end1, _ := w.begin(t, pool)
			r1 := mustPublish(t, pub1, wallet("A", 0))
			done := make(chan error, 1)
			go func() {
				p, err := pub2(wallet("A", 0))
				if err == nil && p.Revision != 2 {
					err = fmt.Errorf("T2 got revision %d of A, want 2", p.Revision)
				}
				if err == nil {
					err = end2(true)
				}
				done <- err
			}()
			waitForLock(t, pool, pid2)
			if err := end1(true); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if r1.Revision != 1 {
				t.Fatalf("T1 got revision %d of A, want 1", r1.Revision)
			}
			checkXIDInverted(t, pool, "A")
			if got := relayedRevisions(t, pool, "A", 3); fmt.Sprint(got) != "[1 2]" {
				t.Fatalf("wallet A delivered as revisions %v, want [1 2]", got)
			}
		})
	}
	t.Run("negative control: outbox rows inserted without the lock", func(t *testing.T) {
		t.Parallel()
		_, pool := pgtest.Ledger(t)
		ctx := context.Background()
		t1, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer t1.Rollback(ctx)
		if _, err := t1.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // T1 "has" revision 1
			t.Fatal(err)
		}
		t2, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer t2.Rollback(ctx)
		if _, err := relaytest.Insert(ctx, t2, "A", 2, nil); err != nil {
			t.Fatal(err)
		}
		if err := t2.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := relaytest.Insert(ctx, t1, "A", 1, nil); err != nil {
			t.Fatal(err)
		}
		if err := t1.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		sink := memory.New(memory.Config{})
		startTestRelay(t, pool, sink, "relay-control", "memory")
		wait.For(t, 10*time.Second, "both rows relayed", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
		var revs []int64
		for _, e := range relaytest.Delivered(t, sink) {
			revs = append(revs, e.Revision)
		}
		if fmt.Sprint(revs) != "[2 1]" {
			t.Fatalf("without the lock A was delivered as %v; the control expects the inversion [2 1]", revs)
		}
	})
}

func mustPublish(t *testing.T, pub func(publish.Message) (publish.Published, error), m publish.Message) publish.Published {
	t.Helper()
	p, err := pub(m)
	if err != nil {
		t.Fatalf("publish %s %s: %v", m.AggregateType, m.AggregateID, err)
	}
	return p
}

// waitForLock waits until backend pid waits for a lock.
func waitForLock(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	wait.For(t, 10*time.Second, "T2 to wait for A's lock", func() bool {
		var waiting bool
		_ = pool.QueryRow(context.Background(), `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		return waiting
	})
}

// checkXIDInverted fails unless revision 2 of wallet agg has the smaller
// transaction ID: the setup really built the inversion.
func checkXIDInverted(t *testing.T, pool *pgxpool.Pool, agg string) {
	t.Helper()
	var x1, x2 uint64
	if err := pool.QueryRow(context.Background(), `SELECT
		(SELECT xid::text::bigint FROM outbox WHERE aggregate_id = $1 AND revision = 1),
		(SELECT xid::text::bigint FROM outbox WHERE aggregate_id = $1 AND revision = 2)`, agg).Scan(&x1, &x2); err != nil {
		t.Fatal(err)
	}
	if x2 >= x1 {
		t.Fatalf("setup: want revision 2's xid (%d) below revision 1's (%d)", x2, x1)
	}
}

// relayedRevisions runs a relay to a memory sink until every row is
// relayed and returns agg's revisions in the order delivered on the
// wallet topic (want is how many records in all to wait for).
func relayedRevisions(t *testing.T, pool *pgxpool.Pool, agg string, want int) []int64 {
	t.Helper()
	sink := memory.New(memory.Config{})
	startTestRelay(t, pool, sink, "relay-publish", "memory")
	wait.For(t, 10*time.Second, "every row relayed", func() bool {
		return relaytest.Unrelayed(t, pool) == 0 && len(sink.Records(walletTopic)) >= want
	})
	var revs []int64
	for _, e := range relaytest.DeliveredOn(t, sink, walletTopic) {
		if e.AggregateID == agg {
			revs = append(revs, e.Revision)
		}
	}
	return revs
}

// TestPublishConcurrentWritersKeepRevisionsGapless: the three writers at
// once, on the same few wallets: every wallet's revisions are 1..n with no
// gap or repeat, in outbox id order, and the relay delivers them in order.
func TestPublishConcurrentWritersKeepRevisionsGapless(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	const perWriter, wallets = 40, 3
	var publishers errgroup.Group
	for _, w := range writers {
		for g := range 2 {
			publishers.Go(func() error {
				for i := range perWriter {
					pub, end, _ := w.begin(t, pool)
					if _, err := pub(wallet(fmt.Sprintf("w-%d", (i+g)%wallets), 0)); err != nil {
						return fmt.Errorf("%s: %w", w.name, err)
					}
					if err := end(true); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	if err := publishers.Wait(); err != nil {
		t.Fatal(err)
	}
	total := perWriter * len(writers) * 2
	rows := pgtest.Column[string](t, pool, `SELECT aggregate_id || ':' || revision FROM outbox ORDER BY id`)
	if len(rows) != total {
		t.Fatalf("%d outbox rows, want %d", len(rows), total)
	}
	next := map[string]int64{}
	for _, r := range rows {
		agg, rev, _ := strings.Cut(r, ":")
		next[agg]++
		if rev != fmt.Sprint(next[agg]) {
			t.Fatalf("in id order %s has revision %s, want %d", agg, rev, next[agg])
		}
	}
	sink := memory.New(memory.Config{})
	startTestRelay(t, pool, sink, "relay-concurrent", "memory")
	wait.For(t, 20*time.Second, "every row relayed", func() bool { return len(sink.Records(walletTopic)) >= total })
	relaytest.CheckOrder(t, relaytest.DeliveredOn(t, sink, walletTopic), false)
}

// TestPublishRolledBackNeverReachesTheSink: a message published in a
// transaction that rolls back is never relayed, and its revision is given
// to the next committed message (no gap).
func TestPublishRolledBackNeverReachesTheSink(t *testing.T) {
	t.Parallel()
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			_, pool := pgtest.Ledger(t)
			pub, end, _ := w.begin(t, pool)
			gone := mustPublish(t, pub, wallet("W", 0))
			if err := end(false); err != nil {
				t.Fatal(err)
			}
			pub, end, _ = w.begin(t, pool)
			kept := mustPublish(t, pub, wallet("W", 0))
			if err := end(true); err != nil {
				t.Fatal(err)
			}
			if kept.Revision != 1 {
				t.Fatalf("after a rollback the next revision is %d, want 1", kept.Revision)
			}
			sink := memory.New(memory.Config{})
			startTestRelay(t, pool, sink, "relay-rollback", "memory")
			wait.For(t, 10*time.Second, "the committed event relayed", func() bool { return len(sink.Records(walletTopic)) >= 1 })
			// The relay passed the rolled-back transaction's position: a
			// second committed event behind it arrives, the rolled-back one never.
			pub, end, _ = w.begin(t, pool)
			mustPublish(t, pub, wallet("W", 0))
			if err := end(true); err != nil {
				t.Fatal(err)
			}
			wait.For(t, 10*time.Second, "the second event relayed", func() bool { return len(sink.Records(walletTopic)) >= 2 })
			for _, e := range relaytest.DeliveredOn(t, sink, walletTopic) {
				if e.EventID == gone.EventID {
					t.Fatalf("event %s of a rolled-back transaction was delivered", gone.EventID)
				}
			}
			if n := len(sink.Records(walletTopic)); n != 2 {
				t.Fatalf("%d records delivered, want the 2 committed", n)
			}
		})
	}
}

// TestPublishRefusalsNameTheFieldInGoAndSQL: each bad message is refused
// with the same error by the Go library and by posthorn_publish, naming
// its field (or the revision it expected), and nothing is written.
func TestPublishRefusalsNameTheFieldInGoAndSQL(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	{ // wallet S is at revision 1
		pub, end, _ := writers[0].begin(t, pool)
		mustPublish(t, pub, wallet("S", 0))
		if err := end(true); err != nil {
			t.Fatal(err)
		}
	}
	mod := func(f func(*publish.Message)) publish.Message { m := wallet("S", 0); f(&m); return m }
	cases := []struct {
		name  string
		m     publish.Message
		field string // "" for a revision refusal
		says  string
	}{
		{"no aggregate type", mod(func(m *publish.Message) { m.AggregateType = "" }), "aggregate_type", "want 1 to 64"},
		{"ledger's aggregate type", mod(func(m *publish.Message) { m.AggregateType = "account" }), "aggregate_type", "the ledger's own"},
		{"aggregate type with a space", mod(func(m *publish.Message) { m.AggregateType = "my wallet" }), "aggregate_type", "want 1 to 64"},
		{"no aggregate id", mod(func(m *publish.Message) { m.AggregateID = "" }), "aggregate_id", "1 to 256"},
		{"aggregate id too long", mod(func(m *publish.Message) { m.AggregateID = strings.Repeat("x", 257) }), "aggregate_id", "1 to 256"},
		{"no type", mod(func(m *publish.Message) { m.Type = "" }), "type", "want 1 to 128"},
		// The limit is on the bytes stored: the Go caller's as given, the SQL
		// caller's jsonb as text (with a space after the colon), the same here.
		{"payload too large", mod(func(m *publish.Message) { m.Payload = fmt.Appendf(nil, `{"x": %q}`, strings.Repeat("a", 1000001)) }), "payload", "at most 1000000"},
		{"contract header", mod(func(m *publish.Message) { m.Headers = map[string]string{"revision": "9"} }), "headers", "contract header"},
		{"bad header key", mod(func(m *publish.Message) { m.Headers = map[string]string{"two words": "x"} }), "headers", "want 1 to 64"},
		{"revision zero or less", mod(func(m *publish.Message) { m.Revision = -1 }), "revision", "want 1 or more"},
		{"revision gap", mod(func(m *publish.Message) { m.Revision = 4 }), "", "the next is 2 (a gap)"},
		{"revision repeat", mod(func(m *publish.Message) { m.Revision = 1 }), "", "the next is 2 (a repeat)"},
	}
	for _, tc := range cases {
		var msgs []string
		for _, w := range []writer{writers[0], writers[1], writers[2]} {
			pub, end, _ := w.begin(t, pool)
			_, err := pub(tc.m)
			_ = end(false)
			if err == nil {
				t.Fatalf("%s: %s accepted it", tc.name, w.name)
			}
			msg := err.Error()
			var fe *publish.FieldError
			var pgErr *pgconn.PgError
			switch {
			case errors.As(err, &fe):
				if fe.Field != tc.field {
					t.Errorf("%s: %s names field %q, want %q", tc.name, w.name, fe.Field, tc.field)
				}
				msg = fe.Field + ": " + fe.Reason
			case errors.Is(err, publish.ErrRevision):
				if tc.field != "" {
					t.Errorf("%s: %s refused the revision, want field %s: %v", tc.name, w.name, tc.field, err)
				}
				_, msg, _ = strings.Cut(err.Error(), publish.ErrRevision.Error()+": ")
				msg = "revision: " + msg
			case errors.As(err, &pgErr):
				msg = pgErr.Message
				if (tc.field == "" && pgErr.Code != "PH001") || (tc.field != "" && (pgErr.Code != "22023" || !strings.HasPrefix(msg, tc.field+": "))) {
					t.Errorf("%s: %s: SQLSTATE %s %q", tc.name, w.name, pgErr.Code, msg)
				}
			default:
				t.Errorf("%s: %s: unclassified error %v", tc.name, w.name, err)
			}
			if !strings.Contains(msg, tc.says) {
				t.Errorf("%s: %s says %q, want it to say %q", tc.name, w.name, msg, tc.says)
			}
			msgs = append(msgs, msg)
		}
		if msgs[0] != msgs[1] || msgs[1] != msgs[2] {
			t.Errorf("%s: the writers' errors differ: %q", tc.name, msgs)
		}
	}
	// A payload that is not JSON is refused before anything is sent: the
	// Go caller's transaction stays usable.
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var fe *publish.FieldError
	if _, err := publish.Pgx(tx).Event(ctx, mod(func(m *publish.Message) { m.Payload = []byte("{not json") })); !errors.As(err, &fe) || fe.Field != "payload" {
		t.Fatalf("not-JSON payload: %v", err)
	}
	if p, err := publish.Pgx(tx).Event(ctx, wallet("S", 2)); err != nil || p.Revision != 2 {
		t.Fatalf("the transaction after a refused payload: %+v, %v", p, err)
	}
	if n := pgtest.Column[int64](t, pool, `SELECT count(*) FROM outbox`); n[0] != 1 {
		t.Fatalf("the refusals wrote rows: %d in the outbox, want the 1 committed", n[0])
	}
}

// TestPublishSQLMatchesGo: posthorn_publish and posthorn_send_command put
// a row where the library does, with core.ShardOf's shard, the library's
// topic and a version 7 UUID.
func TestPublishSQLMatchesGo(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	ids := []string{"w-1", "", "Ünïcødé wallet ✓", strings.Repeat("z", 200)}
	for i := range 200 {
		ids = append(ids, fmt.Sprintf("acct-%d-%x", i, i*7919))
	}
	for _, id := range ids {
		var shard int
		if err := pool.QueryRow(ctx, `SELECT posthorn.shard($1)`, id).Scan(&shard); err != nil {
			t.Fatal(err)
		}
		if shard != core.ShardOf(id) {
			t.Fatalf("posthorn_shard(%q) = %d, core.ShardOf = %d", id, shard, core.ShardOf(id))
		}
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := publish.Pgx(tx).Command(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-9", Type: "payouts.payout.execute", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT * FROM posthorn_send_command('wallet', 'w-9', 'payouts.payout.execute', '{}')`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', 'w-9', 'wallet.credited', '{"amount":"1"}', '{"trace":"t-1"}')`)
		if err != nil {
			return err
		}
		_, err = publish.Pgx(tx).WithCommandTopicPrefix("commands.").Command(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-9", Type: "payouts.payout.execute", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Commands go to the configured prefix only (docs/security.md).
	for _, prefix := range []string{"two words", "cmd."} {
		var fe *publish.FieldError
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := publish.Pgx(tx).WithCommandTopicPrefix(prefix).Command(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-9", Type: "payouts.payout.execute", Payload: []byte(`{}`)})
			return err
		})
		if !errors.As(err, &fe) || fe.Field != "topic_prefix" {
			t.Fatalf("command topic prefix %q: %v", prefix, err)
		}
	}
	rows := pgtest.Column[string](t, pool, `SELECT concat_ws(' ', kind, topic, revision, shard, substr(event_id::text, 15, 1), headers::text) FROM outbox ORDER BY id`)
	want := []string{
		fmt.Sprintf("command commands.payouts 1 %d 7 {}", core.ShardOf("w-9")),
		fmt.Sprintf("command commands.payouts 2 %d 7 {}", core.ShardOf("w-9")),
		fmt.Sprintf(`event events.wallet 3 %d 7 {"trace": "t-1"}`, core.ShardOf("w-9")),
		fmt.Sprintf("command commands.payouts 4 %d 7 {}", core.ShardOf("w-9")),
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("outbox rows\n %q\nwant\n %q", rows, want)
	}
}

// TestPublishGrants: a service in posthorn_publisher (migrate --roles)
// publishes through the library and the SQL functions, and so does the
// write role (a member); the relay's role may call none of them, and no
// role touches the aggregate locks directly.
func TestPublishGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := roletest.Ledger(t)
	for _, group := range []postgres.Role{postgres.RolePublisher, postgres.RoleAPI} {
		pool := roletest.As(t, url, group)
		id := "g-" + string(group)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := publish.Pgx(tx).Event(ctx, wallet(id, 0)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', $1, 'wallet.credited', '{}')`, id)
			if err == nil {
				_, err = tx.Exec(ctx, `SELECT * FROM posthorn_send_command('wallet', $1, 'payouts.payout.execute', '{}')`, id)
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s publishing: %v", group, err)
		}
		if _, err := pool.Exec(ctx, `UPDATE posthorn_aggregates SET revision = 1`); !roletest.Denied(err) {
			t.Fatalf("%s writing posthorn_aggregates directly: %v, want permission denied", group, err)
		}
	}
	relay := roletest.As(t, url, postgres.RoleRelay)
	for _, q := range []string{
		`SELECT * FROM posthorn_publish('wallet', 'g-2', 'wallet.credited', '{}')`,
		`SELECT * FROM posthorn_send_command('wallet', 'g-2', 'payouts.payout.execute', '{}')`,
		`SELECT * FROM posthorn.write('event', 'wallet', 'g-2', 'wallet.credited', '{}')`,
	} {
		if _, err := relay.Exec(ctx, q); !roletest.Denied(err) {
			t.Errorf("posthorn_relay: %s: %v, want permission denied", q, err)
		}
	}
}

// TestVersionedPayloadsGoToTheirHandlers: one wallet's events in schema
// versions 1 and 2 (the amount moved from units to cents) are applied by
// the handler of their version, in revision order, through the relay and
// the inbox; an event of a version with no handler is parked as poison
// naming the version, and not applied by another version's handler.
func TestVersionedPayloadsGoToTheirHandlers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, ledger := pgtest.Ledger(t)
	msgs := []publish.Message{
		{AggregateType: "wallet", AggregateID: "v-1", Type: "wallet.credited", Payload: []byte(`{"amount":5}`)}, // version 0: 1
		{AggregateType: "wallet", AggregateID: "v-1", Type: "wallet.credited", Payload: []byte(`{"amount_cents":700}`), SchemaVersion: 2},
		{AggregateType: "wallet", AggregateID: "v-1", Type: "wallet.credited", Payload: []byte(`{"amount":1}`), SchemaVersion: 1},
		{AggregateType: "wallet", AggregateID: "v-2", Type: "wallet.credited", Payload: []byte(`{"amount_millis":9}`), SchemaVersion: 3},
	}
	var unknown publish.Published
	if err := pgx.BeginFunc(ctx, ledger, func(tx pgx.Tx) error {
		for _, m := range msgs {
			p, err := publish.Pgx(tx).Event(ctx, m)
			if err != nil {
				return err
			}
			unknown = p
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sink := memory.New(memory.Config{})
	startTestRelay(t, ledger, sink, "relay-versions", "memory")
	pool := smallConsumerPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE wallet_cents (wallet text PRIMARY KEY, cents bigint NOT NULL, seen text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	add := func(version string, cents func(p map[string]int64) int64) consumers.Handler {
		return func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
			var p map[string]int64
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				return consumers.Permanent(err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO wallet_cents VALUES ($1, $2, $3)
				ON CONFLICT (wallet) DO UPDATE SET cents = wallet_cents.cents + EXCLUDED.cents, seen = wallet_cents.seen || EXCLUDED.seen`,
				e.AggregateID, cents(p), version)
			return err
		}
	}
	reg := newRegistry(t, pool, 10*time.Second, consumers.Config{
		Subscribers: func(string) (message.Subscriber, error) { return sink.Subscriber(), nil },
		Registerer:  prometheus.NewRegistry(), HoldTime: time.Minute,
	})
	handler := consumers.Versions{
		1: add("1", func(p map[string]int64) int64 { return p["amount"] * 100 }),
		2: add("2", func(p map[string]int64) int64 { return p["amount_cents"] }),
	}.Handler()
	if err := reg.AddEventHandler("wallet-cents", walletTopic, handler, consumers.DependsOnPredecessor()); err != nil {
		t.Fatal(err)
	}
	runRegistry(t, reg, t.Errorf)
	wait.ForStatus(t, 20*time.Second, "the unknown version parked", func() (bool, string) {
		d := disposition(t, pool, "wallet-cents", unknown.EventID)
		return d == core.DispositionParkedPoison, string(d)
	})
	wait.ForStatus(t, 20*time.Second, "wallet v-1 applied", func() (bool, string) {
		got := pgtest.Column[string](t, pool, `SELECT cents || ' ' || seen FROM wallet_cents WHERE wallet = 'v-1'`)
		return fmt.Sprint(got) == "[1300 121]", fmt.Sprint(got)
	})
	if n := pgtest.Column[int64](t, pool, `SELECT count(*) FROM wallet_cents WHERE wallet = 'v-2'`); n[0] != 0 {
		t.Fatal("the event of an unknown version was applied")
	}
	reason := pgtest.Column[string](t, pool, `SELECT reason FROM consumer_inbox WHERE event_id = $1`, unknown.EventID)
	if len(reason) != 1 || !strings.Contains(reason[0], "no handler for schema version 3") {
		t.Fatalf("poison reason %q", reason)
	}
}

// TestOutboxRowsAgreeOnEveryWritePath: the Posting API's write path
// (ledgerstore.Store.Post through Watermill's SQL publisher), the Go publish
// library and the SQL functions write one outbox, and every row means the
// same thing whichever wrote it: the shard is core.ShardOf of the
// aggregate, the topic follows from kind, type and aggregate (ledger.events
// for accounts, events.<aggregate type>, commands.<service>), the event ID
// is a version 7 UUID, the row carries the server's timeline, the headers
// hold only extra headers (contract headers have their own columns and the
// versioning headers at their defaults are not stored), and per aggregate
// revisions run 1, 2, 3 … in outbox id order. The relay's read of each row
// gives the envelope those columns describe.
func TestOutboxRowsAgreeOnEveryWritePath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	store := ledgerstore.New(pool, ledgerstore.Config{MetadataAllowlist: []string{"channel"}})
	post := func(key string) {
		t.Helper()
		p := core.Posting{Entries: []core.Entry{
			{Account: "acc-a", Direction: core.Debit, Amount: 7, Currency: "EUR"},
			{Account: "acc-b", Direction: core.Credit, Amount: 7, Currency: "EUR"},
		}, Metadata: map[string]string{"channel": "web", "note": "not allow-listed"},
			Commands: []core.CommandSpec{{Type: "payouts.payout.execute", Payload: json.RawMessage(`{"to":"acc-b"}`)}}}
		if _, _, err := store.Post(ctx, key, p); err != nil {
			t.Fatal(err)
		}
	}
	post("agree-1")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := publish.Pgx(tx).Event(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-1", Type: "wallet.credited",
			Payload: []byte(`{}`), Headers: map[string]string{"trace": "t-1"}}); err != nil {
			return err
		}
		if _, err := publish.Pgx(tx).Command(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-1", Type: "payouts.payout.execute", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', 'w-1', 'wallet.debited', '{}', '{"trace":"t-2"}')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT * FROM posthorn_send_command('wallet', 'w-1', 'payouts.payout.execute', '{}')`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	post("agree-2")

	var timeline int32
	if err := pool.QueryRow(ctx, `SELECT timeline FROM posthorn.ledger_history()`).Scan(&timeline); err != nil {
		t.Fatal(err)
	}
	type row struct {
		id, shard, revision       int64
		eventID, kind, typ, topic string
		aggType, aggID, headers   string
		timeline                  *int32
	}
	rows, err := pool.Query(ctx, `SELECT id, shard, revision, event_id::text, kind, type, topic, aggregate_type, aggregate_id, headers::text, ledger_timeline
FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.shard, &r.revision, &r.eventID, &r.kind, &r.typ, &r.topic, &r.aggType, &r.aggID, &r.headers, &r.timeline); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	rows.Close()
	if len(got) != 3+3+4 {
		t.Fatalf("%d outbox rows, want 10 (two postings of two events and a command, four from the service)", len(got))
	}
	next := map[[2]string]int64{}
	for _, r := range got {
		topic := "events." + r.aggType
		switch {
		case r.kind == "command":
			topic = core.CommandTopic("commands.", r.typ)
		case r.aggType == core.AggregateAccount:
			topic = core.TopicEvents
		}
		k := [2]string{r.aggType, r.aggID}
		next[k]++
		u, err := uuid.Parse(r.eventID)
		switch {
		case r.shard != int64(core.ShardOf(r.aggID)):
			t.Errorf("row %d (%s %s): shard %d, core.ShardOf %d", r.id, r.aggType, r.aggID, r.shard, core.ShardOf(r.aggID))
		case r.topic != topic:
			t.Errorf("row %d (%s %s): topic %s, want %s", r.id, r.kind, r.typ, r.topic, topic)
		case err != nil || u.Version() != 7:
			t.Errorf("row %d: event ID %s is no version 7 UUID", r.id, r.eventID)
		case r.timeline == nil || *r.timeline != timeline:
			t.Errorf("row %d: ledger_timeline %v, want the server's %d", r.id, r.timeline, timeline)
		case r.revision != next[k]:
			t.Errorf("row %d (%s %s): revision %d, want %d (gapless, in outbox id order)", r.id, r.aggType, r.aggID, r.revision, next[k])
		case strings.Contains(r.headers, core.HeaderSchemaVersion) || strings.Contains(r.headers, core.HeaderContentType) ||
			strings.Contains(r.headers, `"`+core.HeaderEventID+`"`) || strings.Contains(r.headers, "not allow-listed"):
			t.Errorf("row %d: headers %s hold a contract, a default or a not allow-listed header", r.id, r.headers)
		}
	}
	// The relay's read gives the envelopes the columns describe.
	shards := make([]int, core.Shards)
	for i := range shards {
		shards[i] = i
	}
	read, err := relaystore.New(pool).ReadBatchSkipping(ctx, shards, 100, nil, core.OrderByID)
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != len(got) {
		t.Fatalf("the relay read %d rows, want %d", len(read), len(got))
	}
	byID := map[int64]row{}
	for _, r := range got {
		byID[r.id] = r
	}
	for _, o := range read {
		r, e := byID[o.ID], o.Envelope
		h := e.WireHeaders()
		if e.EventID != r.eventID || string(e.Kind) != r.kind || e.Topic != r.topic || e.Revision != r.revision ||
			h[core.HeaderLedgerTimeline] != fmt.Sprint(timeline) || h[core.HeaderSchemaVersion] != "1" || h[core.HeaderContentType] != core.ContentTypeJSON {
			t.Errorf("row %d read as %+v, headers %v", o.ID, e, h)
		}
	}
	t.Logf("%d rows from three write paths agree: shard, topic, UUIDv7, timeline %d, headers, gapless revisions per aggregate", len(got), timeline)
}
