package postgres_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	neturl "net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/ops"
)

func samplePosting() core.Posting {
	return core.Posting{
		Entries: []core.Entry{
			{Account: "acc-alice", Direction: core.Debit, Amount: 1250, Currency: "EUR"},
			{Account: "acc-bob", Direction: core.Credit, Amount: 1250, Currency: "EUR"},
		},
		Metadata: map[string]string{"reference": "inv-1"},
		Commands: []core.CommandSpec{{Type: "payouts.payout.execute", Payload: []byte(`{"beneficiary":"acc-bob"}`)}},
	}
}

func TestRolesAPIWritesPostingsButCannotDeleteOrMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Ledger(t)
	api := roletest.As(t, url, postgres.RoleAPI)

	store := ledgerstore.New(api, ledgerstore.Config{})
	res, replayed, err := store.Post(ctx, "k-1", samplePosting())
	if err != nil || replayed {
		t.Fatalf("post as posthorn_api: %v (replayed %v)", err, replayed)
	}
	if _, replayed, err := store.Post(ctx, "k-1", samplePosting()); err != nil || !replayed {
		t.Fatalf("repeat as posthorn_api: %v (replayed %v)", err, replayed)
	}
	if _, err := store.Posting(ctx, res.JournalID); err != nil {
		t.Fatalf("read posting as posthorn_api: %v", err)
	}
	if acc, err := store.Account(ctx, "acc-bob"); err != nil || acc.Balances["EUR"] != 1250 {
		t.Fatalf("read account as posthorn_api: %+v %v", acc, err)
	}

	// Expired keys it may prune (retention on a schedule in `posthorn
	// api`), through the function only.
	if _, err := opsstore.New(api).PruneIdempotencyKeys(ctx, time.Now().Add(-time.Hour), 100); err != nil {
		t.Fatalf("prune expired idempotency keys as posthorn_api: %v", err)
	}
	roletest.AssertRefused(t, owner, api, []roletest.Refusal{
		{What: "delete idempotency keys", SQL: `DELETE FROM idempotency_keys`},
		{What: "change the database's settings", SQL: `UPDATE posthorn.settings SET idempotency_key_ttl = '1 hour'`},
		{What: "mark an outbox row relayed", SQL: `DELETE FROM outbox_pending`},
		{What: "disable the work queue's trigger", SQL: `ALTER TABLE outbox DISABLE TRIGGER outbox_enqueue`},
		{What: "rewrite an outbox payload", SQL: `UPDATE outbox SET payload = '\x00'`},
		{What: "delete outbox rows", SQL: `DELETE FROM outbox`},
		{What: "truncate the outbox", SQL: `TRUNCATE outbox CASCADE`},
		{What: "delete a journal", SQL: `DELETE FROM journals WHERE false`}, // the privilege is checked before any row
		{What: "delete journal lines", SQL: `DELETE FROM journal_lines`},
		{What: "rewrite a journal line", SQL: `UPDATE journal_lines SET amount = 1`},
		{What: "truncate the idempotency keys", SQL: `TRUNCATE idempotency_keys`},
		{What: "delete a balance", SQL: `DELETE FROM account_opening_balances`},
		{What: "rewrite a balance", SQL: `UPDATE journal_lines SET balance_after = 0`},
		{What: "change an opening balance", SQL: `UPDATE account_opening_balances SET balance = 0`},
		{What: "read the relay's leases", SQL: `SELECT * FROM relay_leases`},
		{What: "take a relay lease", SQL: `UPDATE relay_leases SET owner = 'api'`},
		{What: "write coverage", SQL: `INSERT INTO ops_coverage (consumer, cut_sequence, covered_outbox_id) VALUES ('x', 1, 1)`},
	})
}

func TestRolesRelayReadsOutboxButNotJournalLinesOrBalances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := postedLedgerWithRoles(t)
	relay := roletest.As(t, url, postgres.RoleRelay)
	s := relaystore.New(relay)

	// Everything the relay does, under its role.
	if _, err := s.Heartbeat(ctx, "r1", time.Minute); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	leases, err := s.AcquireLeases(ctx, "r1", core.Shards, nil, time.Minute)
	if err != nil || len(leases) != core.Shards {
		t.Fatalf("acquire leases: %d %v", len(leases), err)
	}
	if leases, err = s.RenewLeases(ctx, "r1", leases, time.Minute); err != nil {
		t.Fatalf("renew leases: %v", err)
	}
	shards := make([]int, len(leases))
	for i, l := range leases {
		shards[i] = l.Shard
	}
	rows, err := s.ReadBatch(ctx, shards, 100, core.OrderByID)
	if err != nil || len(rows) != 3 {
		t.Fatalf("read batch: %d rows, %v", len(rows), err)
	}
	if marked, _, err := s.MarkRelayed(ctx, []core.RowRef{rows[0].RowRef, rows[1].RowRef}, leases); err != nil || marked != 2 {
		t.Fatalf("mark: %d %v", marked, err)
	}
	if _, err := s.Park(ctx, core.ParkedAggregate{AggregateType: "account", AggregateID: "acc-x", EventID: rows[2].Envelope.EventID, Reason: "test"}); err != nil {
		t.Fatalf("park: %v", err)
	}
	if err := s.Release(ctx, "account", "acc-x"); err != nil {
		t.Fatalf("release: %v", err)
	}
	// The release moved the generation through the trigger, which runs as
	// posthorn_definer: the relay may not write relay_release itself.
	var gen int64
	if err := relay.QueryRow(ctx, `SELECT generation FROM relay_release`).Scan(&gen); err != nil || gen < 1 {
		t.Fatalf("release generation after a release: %d, %v", gen, err)
	}
	if _, err := s.Status(ctx); err != nil {
		t.Fatalf("status: %v", err)
	}
	if _, err := s.OldestOpenTransactionAge(ctx); err != nil {
		t.Fatalf("open transaction age: %v", err)
	}
	if err := s.ReleaseLeases(ctx, "r1", leases); err != nil {
		t.Fatalf("release leases: %v", err)
	}
	if err := s.Leave(ctx, "r1"); err != nil {
		t.Fatalf("leave: %v", err)
	}

	roletest.AssertRefused(t, owner, relay, []roletest.Refusal{
		{What: "read journal lines", SQL: `SELECT * FROM journal_lines`},
		{What: "read balances", SQL: `SELECT * FROM account_balances`},
		{What: "change a balance", SQL: `UPDATE journal_lines SET balance_after = 0`},
		{What: "read accounts", SQL: `SELECT * FROM accounts`},
		{What: "read account revisions", SQL: `SELECT * FROM account_revisions`},
		{What: "read journal metadata", SQL: `SELECT metadata FROM journals`},
		{What: "read idempotency responses", SQL: `SELECT * FROM idempotency_keys`},
		{What: "rewrite an outbox payload", SQL: `UPDATE outbox SET payload = '\x00'`},
		{What: "insert an outbox row", SQL: `INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
VALUES (gen_random_uuid(), 'event', 't', 't', 'account', 'x', 99, 0, '', now())`},
		{What: "delete outbox rows", SQL: `DELETE FROM outbox`},
		{What: "write coverage", SQL: `INSERT INTO ops_coverage (consumer, cut_sequence, covered_outbox_id) VALUES ('x', 1, 1)`},
		// Set back, the next release would not move it past what the
		// relays' marks were made under.
		{What: "set the release generation", SQL: `UPDATE relay_release SET generation = 0`},
	})
}

// The relay's held-by-open-transaction gauge reads other sessions'
// xact_start in pg_stat_activity, which PostgreSQL hides from roles without
// pg_read_all_stats (it would read zero while an API transaction holds the
// relay back). The reconciler's in-flight check reads backend_xid, which
// every role sees. Control: a role without the grant does not see
// xact_start.
func TestRolesSeeOtherRolesTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := roletest.Ledger(t)
	api := roletest.As(t, url, postgres.RoleAPI)
	tx, err := api.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (id) VALUES ('acc-open')`); err != nil {
		t.Fatal(err)
	}
	var apiPID int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&apiPID); err != nil {
		t.Fatal(err)
	}
	sees := func(pool *pgxpool.Pool, column string) bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND `+column+` IS NOT NULL`, apiPID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	relay := roletest.As(t, url, postgres.RoleRelay)
	if !sees(relay, "xact_start") {
		t.Error("posthorn_relay does not see the start of the API's open transaction")
	}
	if age, err := relaystore.New(relay).OldestOpenTransactionAge(ctx); err != nil || age <= 0 {
		t.Errorf("posthorn_relay: open transaction age %v, %v; want > 0", age, err)
	}
	if !sees(roletest.As(t, url, postgres.RoleReconciler), "backend_xid") {
		t.Error("posthorn_reconciler does not see the API's transaction ID")
	}
	if sees(roletest.As(t, url, postgres.RoleConsumer), "xact_start") {
		t.Error("control: a role without pg_read_all_stats sees another role's xact_start; the grant would prove nothing")
	}
}

func TestRolesReconcilerReadsAndRecordsCoverageOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := postedLedgerWithRoles(t)
	rec := roletest.As(t, url, postgres.RoleReconciler)
	store := opsstore.New(rec)
	cut, err := store.OpenCut(ctx, ops.CutRequest{Settle: 5 * time.Second})
	if err != nil {
		t.Fatalf("open cut as posthorn_reconciler: %v", err)
	}
	if _, _, err := cut.LinesWithoutEvents(ctx, 10); err != nil {
		t.Fatalf("lines without events: %v", err)
	}
	if err := cut.ExpectedEvents(ctx, 10, func([]ops.ExpectedEvent) error { return nil }); err != nil {
		t.Fatalf("expected events: %v", err)
	}
	covered, err := cut.CoveredOutboxID(ctx)
	if err != nil {
		t.Fatalf("covered outbox id: %v", err)
	}
	cut.Close()
	if _, err := store.RecordCoverage(ctx, "balance-projection", cut.Sequence, covered); err != nil {
		t.Fatalf("record coverage: %v", err)
	}
	roletest.AssertRefused(t, owner, rec, []roletest.Refusal{
		{What: "change a balance", SQL: `UPDATE journal_lines SET balance_after = 0`},
		{What: "bump a revision", SQL: `UPDATE accounts SET revision = revision + 1`},
		// The view it reads is simple enough to write through.
		{What: "delete accounts through account_revisions", SQL: `DELETE FROM account_revisions WHERE id = 'acc-none'`},
		{What: "insert a journal", SQL: `INSERT INTO journals (id, sequence, posted_at) VALUES (gen_random_uuid(), 999, now())`},
		{What: "mark outbox rows", SQL: `DELETE FROM outbox_pending`},
		{What: "delete outbox rows", SQL: `DELETE FROM outbox`},
		{What: "move the cleanup floor", SQL: `INSERT INTO ops_cleanup (deleted_through_id) VALUES (1)`},
		{What: "take a relay lease", SQL: `UPDATE relay_leases SET owner = 'rec'`},
		// It reads relay_release for the backlog's count; moving it
		// would make every relay read each shard from its start.
		{What: "drop the relays' low-water marks", SQL: `UPDATE relay_release SET generation = generation + 1`},
	})
}

func TestRolesConsumerOwnsItsInboxAndCannotTouchTheLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ledgerURL, ledgerOwner := roletest.Ledger(t)
	consumerURL, consumerOwner := roletest.Consumer(t)
	login := roletest.Consumers(t, consumerURL, "", "balance-projection")
	cons := roletest.Pool(t, login)

	in := inboxstore.New(cons)
	env := core.Envelope{EventID: "0190a000-0000-7000-8000-000000000001", Kind: core.KindEvent, Type: core.TypeAccountPosted,
		AggregateType: core.AggregateAccount, AggregateID: "acc-alice", Revision: 1, OccurredAt: time.Now()}
	out, err := in.Receive(ctx, "balance-projection", true, env, func(ctx context.Context, tx pgx.Tx, _ core.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO projection_balances (account, currency, balance, revision) VALUES ('acc-alice', 'EUR', 5, 1)`)
		return err
	})
	if err != nil || out.Disposition != core.DispositionApplied {
		t.Fatalf("receive as posthorn_consumer: %+v %v", out, err)
	}
	if _, err := in.Count(ctx, "balance-projection"); err != nil {
		t.Fatalf("count: %v", err)
	}

	// The same login on the ledger database: nothing.
	onLedger := roletest.Pool(t, withDatabaseOf(t, login, ledgerURL))
	roletest.AssertRefused(t, ledgerOwner, onLedger, []roletest.Refusal{
		{What: "read accounts", SQL: `SELECT * FROM accounts`},
		{What: "read journal lines", SQL: `SELECT * FROM journal_lines`},
		{What: "read the outbox", SQL: `SELECT * FROM outbox`},
		{What: "change a balance", SQL: `UPDATE journal_lines SET balance_after = 0`},
		{What: "insert a journal", SQL: `INSERT INTO journals (id, sequence, posted_at) VALUES (gen_random_uuid(), 999, now())`},
		{What: "mark outbox rows", SQL: `DELETE FROM outbox_pending`},
	})
	// Inbox retention runs as the consumer: it deletes final rows
	// behind the horizon and records it.
	if _, err := in.PruneInbox(ctx, "balance-projection", ops.InboxHorizon{Ordered: time.Now().Add(-time.Hour), Unordered: time.Now().Add(-time.Hour)}, 100); err != nil {
		t.Fatalf("inbox retention as posthorn_consumer: %v", err)
	}
	roletest.AssertRefused(t, consumerOwner, cons, []roletest.Refusal{
		{What: "truncate the inbox", SQL: `TRUNCATE consumer_inbox`},
		{What: "drop the projection", SQL: `TRUNCATE projection_balances`},
		// A mark moved past its rows would hide them from reconciliation's
		// next pass.
		{What: "record its own reconciliation mark", SQL: `INSERT INTO consumer_reconciled (consumer, mark, server, ledger_history)
VALUES ('balance-projection', pg_current_xact_id(), 0, 'any')`},
		{What: "move its reconciliation mark", SQL: `UPDATE consumer_reconciled SET mark = pg_current_xact_id()`},
		{What: "stamp an inbox row as unchanged", SQL: `ALTER TABLE consumer_inbox DISABLE TRIGGER consumer_inbox_changed`},
	})
}

// On a consumer's database the reconciler reads every consumer's inbox and
// records the marks of its passes, and writes nothing else.
func TestRolesReconcilerRecordsMarksOnlyInTheConsumerDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	consumerURL, consumerOwner := roletest.Consumer(t)
	if _, err := consumerOwner.Exec(ctx, `INSERT INTO consumer_inbox (consumer, event_id, aggregate_type, aggregate_id, revision, disposition)
VALUES ('balance-projection', 'e1', 'account', 'acc-alice', 1, 'applied')`); err != nil {
		t.Fatal(err)
	}
	rec := roletest.As(t, consumerURL, postgres.RoleReconciler)
	in := inboxstore.New(rec)
	p, err := in.BeginPass(ctx, "balance-projection", "h")
	if err != nil {
		t.Fatalf("begin a pass as posthorn_reconciler: %v", err)
	}
	if err := in.RecordMark(ctx, "balance-projection", p.Next, "h", ""); err != nil {
		t.Fatalf("record a mark as posthorn_reconciler: %v", err)
	}
	if _, err := in.AppliedTwiceSince(ctx, "balance-projection", 1); err != nil {
		t.Fatalf("applied twice since a mark as posthorn_reconciler: %v", err)
	}
	// A database migrated but whose grants were not applied again says so.
	if _, err := consumerOwner.Exec(ctx, `REVOKE ALL ON consumer_reconciled FROM posthorn_reconciler`); err != nil {
		t.Fatal(err)
	}
	if _, err := in.BeginPass(ctx, "balance-projection", "h"); err == nil || !strings.Contains(err.Error(), "run posthorn migrate --consumer --roles") {
		t.Fatalf("without its grant: %v, want the hint to apply the roles", err)
	}
	if _, err := consumerOwner.Exec(ctx, `GRANT SELECT, INSERT, UPDATE ON consumer_reconciled TO posthorn_reconciler`); err != nil {
		t.Fatal(err)
	}
	roletest.AssertRefused(t, consumerOwner, rec, []roletest.Refusal{
		{What: "change a disposition", SQL: `UPDATE consumer_inbox SET disposition = 'duplicate'`},
		{What: "delete inbox rows", SQL: `DELETE FROM consumer_inbox`},
		{What: "record a disposition", SQL: `INSERT INTO consumer_inbox (consumer, event_id, disposition) VALUES ('balance-projection', 'e2', 'applied')`},
		{What: "change a balance", SQL: `UPDATE projection_balances SET balance = 0`},
		{What: "stamp an inbox row as unchanged", SQL: `ALTER TABLE consumer_inbox DISABLE TRIGGER consumer_inbox_changed`},
	})
}

// withDatabaseOf returns u pointing at the database of other.
func withDatabaseOf(t *testing.T, u, other string) string {
	t.Helper()
	a, err := neturl.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	b, err := neturl.Parse(other)
	if err != nil {
		t.Fatal(err)
	}
	a.Path = b.Path
	return a.String()
}

// ApplyRoles is re-runnable and safe to run against several databases of
// the cluster at once (roles are cluster-wide, advisory locks are not).
func TestApplyRolesIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	var urls []string
	for range 3 {
		u, _ := pgtest.Ledger(t)
		urls = append(urls, u)
	}
	var appliers errgroup.Group
	for _, u := range urls {
		for range 2 {
			appliers.Go(func() error { return postgres.ApplyRoles(context.Background(), u, postgres.LedgerSchema) })
		}
	}
	if err := appliers.Wait(); err != nil {
		t.Fatal(err)
	}
}

// Every table and sequence the migrations create is named in the role SQL
// of its schema, so a new migration cannot leave a table outside the
// revoke-then-grant (and the roles with stale or missing privileges).
func TestRolesSQLNamesEveryTable(t *testing.T) {
	t.Parallel()
	for _, schema := range []postgres.Schema{postgres.LedgerSchema, postgres.ConsumerSchema} {
		var pool *pgxpool.Pool
		if schema == postgres.LedgerSchema {
			_, pool = pgtest.Ledger(t)
		} else {
			_, pool = pgtest.Consumer(t)
		}
		_, grants, err := postgres.RolesSQL(schema)
		if err != nil {
			t.Fatal(err)
		}
		names := pgtest.Column[string](t, pool, `SELECT CASE WHEN n.nspname = 'public' THEN relname ELSE n.nspname || '.' || relname END
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname IN ('public', 'posthorn') AND c.relkind IN ('r', 'S', 'p')`)
		if len(names) < 4 {
			t.Fatalf("%s: found only %v", schema, names)
		}
		for _, n := range names {
			if strings.HasSuffix(n, "_migrations_id_seq") {
				continue // goose's own; no role touches its table
			}
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(n) + `\b`).MatchString(grants) {
				t.Errorf("%s schema: %s is not named in roles/%s.sql", schema, n, schema)
			}
		}
	}
}

func TestWarnIfSuperuser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Ledger(t)
	api := roletest.As(t, url, postgres.RoleAPI)
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	postgres.WarnIfSuperuser(ctx, owner, log, "api", postgres.RoleAPI) // pgtest connects as the superuser postgres
	if !strings.Contains(buf.String(), `"level":"WARN"`) || !strings.Contains(buf.String(), `"superuser":true`) {
		t.Fatalf("no warning for a superuser DSN: %q", buf.String())
	}
	buf.Reset()
	postgres.WarnIfSuperuser(ctx, api, log, "api", postgres.RoleAPI)
	if buf.Len() != 0 {
		t.Fatalf("warning for a posthorn_api login: %q", buf.String())
	}
}

// The verifier CreateLogin sends equals the one PostgreSQL computes itself
// for the same password, salt and iteration count.
func TestSCRAMVerifierMatchesPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := roletest.Ledger(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	name := fmt.Sprintf("posthorn_t_scram_%d", time.Now().UnixNano())
	const password = "correct horse battery staple"
	if _, err := conn.Exec(ctx, `SET password_encryption = 'scram-sha-256'`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE ROLE "+name+" PASSWORD '"+password+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+name) })
	var theirs string
	if err := conn.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = $1`, name).Scan(&theirs); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^SCRAM-SHA-256\$(\d+):([^$]+)\$`).FindStringSubmatch(theirs)
	if m == nil {
		t.Fatalf("unexpected verifier shape %q", theirs)
	}
	iter, _ := strconv.Atoi(m[1])
	salt, err := base64.StdEncoding.DecodeString(m[2])
	if err != nil {
		t.Fatal(err)
	}
	ours, err := postgres.ScramVerifierForTest(password, salt, iter)
	if err != nil {
		t.Fatal(err)
	}
	if ours != theirs {
		t.Fatalf("verifier differs:\nours   %s\ntheirs %s", ours, theirs)
	}
	if other, _ := postgres.ScramVerifierForTest(password+"x", salt, iter); other == theirs {
		t.Fatal("control: another password gives the same verifier")
	}
	// CreateLogin stores a verifier of the password, never the password.
	login := name + "_login"
	if err := postgres.CreateLogin(ctx, conn.Conn(), login, password, postgres.RoleAPI); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+login) })
	var stored string
	if err := conn.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = $1`, login).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	m = regexp.MustCompile(`^SCRAM-SHA-256\$(\d+):([^$]+)\$`).FindStringSubmatch(stored)
	if m == nil || strings.Contains(stored, password) {
		t.Fatalf("stored %q", stored)
	}
	salt, _ = base64.StdEncoding.DecodeString(m[2])
	if again, _ := postgres.ScramVerifierForTest(password, salt, iter); again != stored {
		t.Fatal("the stored verifier is not the password's")
	}
}

func TestRolesMaintainerDeletesOutboxRowsOnly(t *testing.T) {
	t.Parallel()
	url, owner := postedLedgerWithRoles(t)
	m := roletest.As(t, url, postgres.RoleMaintainer)
	// `posthorn retention` as the maintainer prunes expired keys through
	// the function, and may not delete keys itself.
	if _, err := opsstore.New(m).PruneIdempotencyKeys(context.Background(), time.Now().Add(-time.Hour), 100); err != nil {
		t.Fatalf("prune expired idempotency keys as posthorn_maintainer: %v", err)
	}
	roletest.AssertRefused(t, owner, m, []roletest.Refusal{
		{What: "delete idempotency keys", SQL: `DELETE FROM idempotency_keys`},
		{What: "read journal lines", SQL: `SELECT * FROM journal_lines`},
		{What: "read balances", SQL: `SELECT * FROM account_balances`},
		{What: "read journal metadata", SQL: `SELECT metadata FROM journals`},
		{What: "delete a journal", SQL: `DELETE FROM journals WHERE false`},
		{What: "mark outbox rows", SQL: `DELETE FROM outbox_pending`},
		{What: "insert an outbox row", SQL: `INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
VALUES (gen_random_uuid(), 'event', 't', 't', 'account', 'x', 99, 0, '', now())`},
		{What: "write coverage", SQL: `INSERT INTO ops_coverage (consumer, cut_sequence, covered_outbox_id) VALUES ('x', 1, 1)`},
	})
}

// postedLedgerWithRoles returns the URL and the owner's pool of a fresh
// ledger database with the component roles applied and one sample posting.
func postedLedgerWithRoles(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url, owner := roletest.Ledger(t)
	if _, _, err := ledgerstore.New(owner, ledgerstore.Config{}).Post(context.Background(), "k-1", samplePosting()); err != nil {
		t.Fatal(err)
	}
	return url, owner
}

// The example consumers' tables' version tables are the owner's alone: a
// consumer that could delete their rows would make migrate --consumer
// re-run the tables' first migration, and consume believe them missing.
// Applying the roles revokes a stray grant on them; the control is the
// same delete succeeding while that grant is in place.
func TestRolesRevokeStrayGrantsOnTheExampleTablesVersionTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	consumerURL, owner := roletest.Consumer(t)
	cons := roletest.Pool(t, roletest.Consumers(t, consumerURL, "", "balance-projection"))
	deletes := []roletest.Refusal{
		{What: "delete the projection's tables' versions", SQL: `DELETE FROM posthorn_consumer_balance_projection_migrations`},
		{What: "delete the audit log's tables' versions", SQL: `DELETE FROM posthorn_consumer_audit_log_migrations`},
	}
	roletest.AssertRefused(t, owner, cons, deletes)
	for _, d := range deletes {
		table := strings.Fields(d.SQL)[2]
		if _, err := owner.Exec(ctx, `GRANT DELETE ON `+table+` TO posthorn_consumer_balance_projection`); err != nil {
			t.Fatal(err)
		}
		tx, err := cons.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, d.SQL); err != nil {
			t.Fatalf("control: %s with a stray grant fails (%v), so the revoke below proves nothing", d.What, err)
		}
		_ = tx.Rollback(ctx)
	}
	roletest.Apply(t, consumerURL, postgres.ConsumerSchema)
	roletest.AssertRefused(t, owner, cons, deletes)
}
