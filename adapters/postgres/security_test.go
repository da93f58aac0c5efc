package postgres_test

// The security battery of the ledger database: each attack runs as the
// role that would misuse it, against the real server, and must be refused;
// each has its negative control, the old grant or the previous release's
// functions (the ledger migrated to version 8 only), where the same attack
// works.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/publish"
)

// The three attacks with a publishing service's credential.
const (
	// A journal line crediting acc-bob 100,000,000 at its next revision,
	// carrying the balance that follows: the account's balance.
	attackBalance = `WITH j AS (INSERT INTO journals (id, sequence, posted_at) VALUES (gen_random_uuid(), 999, now()) RETURNING id)
INSERT INTO journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision, balance_after)
SELECT j.id, 1, 'acc-bob', 'credit', 100000000, 'EUR', r.revision + 1, b.balance + 100000000
FROM j, account_revisions AS r, account_balances AS b WHERE r.id = 'acc-bob' AND b.account_id = 'acc-bob' AND b.currency = 'EUR'`
	// The account's next revision with a forged delta, on the ledger's topic.
	attackForgedEvent = `INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
VALUES (gen_random_uuid(), 'event', 'ledger.account.posted', 'ledger.events', 'account', 'acc-bob', 2, 0,
        convert_to('{"account":"acc-bob","revision":2,"currency":"EUR","delta":"100000000"}', 'UTF8'), now())`
	attackForgetKeys = `DELETE FROM idempotency_keys`
)

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// A service in posthorn_publisher publishes through the library and both
// SQL functions, and is refused every write of the ledger. Control: the
// role the old docs told teams to grant (posthorn_api) rewrites a balance
// and forges an account's event with the same statements.
func TestSecurityPublisherCannotTouchTheLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := postedLedgerWithRoles(t)
	pub := roletest.As(t, url, postgres.RolePublisher)

	err := pgx.BeginFunc(ctx, pub, func(tx pgx.Tx) error {
		if _, err := publish.Pgx(tx).Event(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-1", Type: "wallet.credited", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		if _, err := publish.Pgx(tx).Command(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-1", Type: "payouts.payout.execute", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', 'w-1', 'wallet.credited', '{}')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT * FROM posthorn_send_command('wallet', 'w-1', 'payouts.payout.execute', '{}')`)
		return err
	})
	if err != nil {
		t.Fatalf("publishing as posthorn_publisher: %v", err)
	}

	roletest.AssertRefused(t, owner, pub, []roletest.Refusal{
		{What: "raise a balance", SQL: attackBalance},
		{What: "forge an account's event", SQL: attackForgedEvent},
		{What: "forget the idempotency keys", SQL: attackForgetKeys},
		{What: "bump an account's revision", SQL: `UPDATE accounts SET revision = revision + 1`},
		{What: "insert a journal", SQL: `INSERT INTO journals (id, sequence, posted_at) VALUES (gen_random_uuid(), 999, now())`},
		{What: "rewrite a journal line", SQL: `UPDATE journal_lines SET amount = 1`},
		{What: "move an aggregate's revision", SQL: `UPDATE posthorn_aggregates SET revision = 1`},
		{What: "read the idempotency responses", SQL: `SELECT * FROM idempotency_keys`},
		{What: "prune the idempotency keys", SQL: `SELECT posthorn.prune_idempotency_keys(now(), 1000)`},
		{What: "change the command topic prefix", SQL: `UPDATE posthorn.settings SET command_topic_prefix = 'x.'`},
	})
	if _, err := pub.Exec(ctx, `SELECT * FROM posthorn_publish('account', 'acc-bob', 'ledger.account.posted', '{"delta":"100000000"}')`); sqlState(err) != "22023" ||
		!strings.HasPrefix(err.(*pgconn.PgError).Message, "aggregate_type:") {
		t.Errorf("an account's event through posthorn_publish: %v, want 22023 naming aggregate_type", err)
	}
	if got := pgtest.Column[int64](t, owner, `SELECT balance FROM account_balances WHERE account_id = 'acc-bob'`); got[0] != 1250 {
		t.Fatalf("acc-bob's balance is %d, want 1250", got[0])
	}

	// Control: the old advice, GRANT posthorn_api TO <service role>.
	old := roletest.As(t, url, postgres.RoleAPI)
	for _, q := range []string{attackBalance, attackForgedEvent} {
		if _, err := old.Exec(ctx, q); err != nil {
			t.Fatalf("control: with posthorn_api the attack %q fails (%v), so the refusal above proves nothing", q, err)
		}
	}
	if got := pgtest.Column[int64](t, owner, `SELECT balance FROM account_balances WHERE account_id = 'acc-bob'`); got[0] != 100001250 {
		t.Fatalf("control: acc-bob's balance is %d after the attack, want 100001250", got[0])
	}
}

// No component deletes an idempotency key a client may still retry with:
// the API's role (whose credential a publishing service used to hold) is
// refused the DELETE, and its retention function keeps every key younger
// than the configured lifetime, so the retry replays instead of posting
// twice. Control: with the old grant (DELETE to posthorn_api) the same
// role forgets the key and the retry is a second posting.
func TestSecurityIdempotencyKeysOutliveAStolenAPICredential(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := postedLedgerWithRoles(t) // key k-1
	api := roletest.As(t, url, postgres.RoleAPI)
	store := ledgerstore.New(api, ledgerstore.Config{})
	if _, _, err := store.Post(ctx, "k-old", samplePosting()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner, `UPDATE idempotency_keys SET created_at = now() - interval '40 days' WHERE key = 'k-old'`)

	if _, err := api.Exec(ctx, attackForgetKeys); !roletest.Denied(err) {
		t.Fatalf("DELETE FROM idempotency_keys as posthorn_api: %v, want permission denied", err)
	}
	// The retention function with a horizon in the future: only the expired key goes.
	var n int64
	if err := api.QueryRow(ctx, `SELECT posthorn.prune_idempotency_keys(now() + interval '1 day', 1000)`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("prune as posthorn_api: %d, %v; want the 1 expired key", n, err)
	}
	if _, replayed, err := store.Post(ctx, "k-1", samplePosting()); err != nil || !replayed {
		t.Fatalf("the client's retry: replayed %v, %v; want the stored response", replayed, err)
	}

	// Control: the grant posthorn_api held before.
	mustExec(t, owner, `GRANT DELETE ON idempotency_keys TO posthorn_api`)
	if _, err := api.Exec(ctx, attackForgetKeys); err != nil {
		t.Fatalf("control: DELETE with the old grant: %v", err)
	}
	if _, replayed, err := store.Post(ctx, "k-1", samplePosting()); err != nil || replayed {
		t.Fatalf("control: the retry after the keys were forgotten: replayed %v, %v; want a second posting", replayed, err)
	}
}

// oldLedger is a ledger database as the previous release left it: migrated
// to version 8, with the grant its docs advised for a service's role
// (EXECUTE on posthorn_publish and posthorn_send_command, here to
// posthorn_publisher), and the balances of one posting. It returns the URL of a fresh
// publisher login and the owner's pool.
func oldLedger(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	u := pgtest.LedgerAt(t, 8)
	owner := pgtest.SmallPool(t, u, 2)
	// What samplePosting leaves, written as that release did: today's
	// store needs today's schema.
	mustExec(t, owner, `INSERT INTO accounts (id, revision) VALUES ('acc-alice', 1), ('acc-bob', 1)`)
	mustExec(t, owner, `INSERT INTO account_balances (account_id, currency, balance) VALUES ('acc-alice', 'EUR', -1250), ('acc-bob', 'EUR', 1250)`)
	roletest.Ledger(t) // the cluster's group roles exist
	mustExec(t, owner, `GRANT EXECUTE ON FUNCTION posthorn_publish(text, text, text, jsonb, jsonb, bigint),
    posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text) TO posthorn_publisher`)
	return roletest.Login(t, u, postgres.RolePublisher, ""), owner
}

// plantShadows creates shadowPublic as attacker; its objects are dropped
// before the attacker's role is.
func plantShadows(t *testing.T, owner, attacker *pgxpool.Pool) {
	t.Helper()
	name := pgtest.Column[string](t, attacker, `SELECT current_user::text`)[0]
	mustExec(t, attacker, shadowPublic)
	t.Cleanup(func() {
		if _, err := owner.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("drop the shadows: %v", err)
		}
	})
}

// shadowPublic is the attacker's part: in a schema public every role may
// create in (PostgreSQL 14's default), functions and an operator that
// shadow the built-ins the publishing functions call, each recording whose
// rights it ran with and raising acc-bob's balance.
const shadowPublic = `
CREATE TABLE public.hijacked (who text);
GRANT INSERT ON public.hijacked TO PUBLIC;
CREATE FUNCTION public.hijack() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.hijacked VALUES (current_user);
    BEGIN
        UPDATE public.account_balances SET balance = balance + 100000000 WHERE account_id = 'acc-bob';
    -- Refused, or (since the balances became a view) not updatable at all.
    EXCEPTION WHEN insufficient_privilege OR feature_not_supported THEN NULL;
    END;
END $$;
CREATE FUNCTION public.convert_to(t text, enc text) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.hijack();
    RETURN pg_catalog.convert_to(t, enc::name);
END $$;
CREATE FUNCTION public.xor_hijack(a bigint, b integer) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.hijack();
    RETURN a # b::bigint;
END $$;
CREATE OPERATOR public.# (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = public.xor_hijack);
GRANT EXECUTE ON FUNCTION public.hijack(), public.convert_to(text, text), public.xor_hijack(bigint, integer) TO PUBLIC`

// A caller's shadows of built-ins in a writable public never run inside the
// definer functions: they look in pg_catalog only, and run as a role that
// could not change a balance anyway. Controls: the shadow does take over an
// unqualified call in the attacker's own session, and inside the previous
// release's posthorn_publish it ran as the superuser and raised the balance.
func TestSecurityDefinerFunctionsIgnoreAShadowInPublic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := postedLedgerWithRoles(t)
	mustExec(t, owner, `GRANT CREATE ON SCHEMA public TO PUBLIC`)
	pub := roletest.As(t, url, postgres.RolePublisher)
	plantShadows(t, owner, pub)

	err := pgx.BeginFunc(ctx, pub, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', 'w-1', 'wallet.credited', '{"amount":"1"}')`); err != nil {
			return err
		}
		_, err := publish.Pgx(tx).Command(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-1", Type: "payouts.payout.execute", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatalf("publish next to the shadows: %v", err)
	}
	if who := pgtest.Column[string](t, owner, `SELECT who FROM hijacked`); len(who) != 0 {
		t.Fatalf("a shadow ran inside the publishing functions as %v", who)
	}
	if got := pgtest.Column[int64](t, owner, `SELECT balance FROM account_balances WHERE account_id = 'acc-bob'`); got[0] != 1250 {
		t.Fatalf("acc-bob's balance is %d, want 1250", got[0])
	}
	// Control 1: the shadow is live for an unqualified call with public on the path.
	mustExec(t, pub, `SELECT convert_to('x', 'UTF8')`)
	if who := pgtest.Column[string](t, owner, `SELECT who FROM hijacked`); len(who) != 1 {
		t.Fatalf("control: the shadow did not take the attacker's own call (%v), so its silence above proves nothing", who)
	}

	// Control 2: the previous release's functions, same attack.
	oldURL, oldOwner := oldLedger(t)
	mustExec(t, oldOwner, `GRANT CREATE ON SCHEMA public TO PUBLIC`)
	attacker := roletest.Pool(t, oldURL)
	plantShadows(t, oldOwner, attacker)
	mustExec(t, attacker, `SELECT * FROM posthorn_publish('wallet', 'w-1', 'wallet.credited', '{"amount":"1"}')`)
	if who := pgtest.Column[string](t, oldOwner, `SELECT DISTINCT who FROM hijacked`); len(who) != 1 || who[0] != "postgres" {
		t.Fatalf("control: in the old posthorn_publish the shadow ran as %v, want the superuser postgres", who)
	}
	if got := pgtest.Column[int64](t, oldOwner, `SELECT balance FROM account_balances WHERE account_id = 'acc-bob'`); got[0] == 1250 {
		t.Fatal("control: the old posthorn_publish's shadow left the balance alone")
	}
}

// definerFaults lists each SECURITY DEFINER function of the database that
// breaks a rule: it lives in the schema posthorn, its search_path is
// pg_catalog, pg_temp, its owner is posthorn_definer (no superuser), and
// PUBLIC may not execute it.
const definerFaults = `
SELECT p.oid::regprocedure::text || ': ' || concat_ws(', ',
    CASE WHEN n.nspname <> 'posthorn' THEN 'in schema ' || n.nspname END,
    CASE WHEN p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp'] THEN 'config ' || coalesce(p.proconfig::text, 'none') END,
    CASE WHEN r.rolname <> 'posthorn_definer' OR r.rolsuper THEN 'owned by ' || r.rolname END,
    CASE WHEN has_function_privilege('public', p.oid, 'EXECUTE') THEN 'executable by PUBLIC' END)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_roles r ON r.oid = p.proowner
WHERE p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND (n.nspname <> 'posthorn' OR p.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, pg_temp']
       OR r.rolname <> 'posthorn_definer' OR r.rolsuper OR has_function_privilege('public', p.oid, 'EXECUTE'))
ORDER BY 1`

// Every definer function of a migrated ledger with the roles applied keeps
// the rules; the previous release's broke them.
func TestSecurityDefinerFunctionsAreHardened(t *testing.T) {
	t.Parallel()
	_, owner := roletest.Ledger(t)
	if n := pgtest.Column[int64](t, owner, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.prosecdef AND n.nspname = 'posthorn'`); n[0] != 11 {
		t.Fatalf("%d definer functions in schema posthorn, want posthorn.write, posthorn.prune_idempotency_keys, posthorn.dead_letter, posthorn.raise_revision_floor, posthorn.relay_parked_released and the six posthorn.failover_*", n[0])
	}
	if faults := pgtest.Column[string](t, owner, definerFaults); len(faults) != 0 {
		t.Fatalf("definer functions break the rules:\n%s", strings.Join(faults, "\n"))
	}
	if super := pgtest.Column[bool](t, owner, `SELECT rolsuper OR rolcanlogin FROM pg_roles WHERE rolname = 'posthorn_definer'`); len(super) != 1 || super[0] {
		t.Fatalf("posthorn_definer is a superuser or may log in: %v", super)
	}
	_, oldOwner := oldLedger(t)
	if faults := pgtest.Column[string](t, oldOwner, definerFaults); len(faults) < 4 {
		t.Fatalf("control: the old definer functions pass the check (%v), so it proves nothing", faults)
	}
}

// Commands go to the configured prefix: a caller that names the ledger's
// or an events topic's prefix, or any other, is refused naming
// topic_prefix, and nothing is written. Control: the previous release put
// the caller's command on ledger.events.
func TestSecurityCommandTopicPrefixIsTheConfigurations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Ledger(t)
	pub := roletest.As(t, url, postgres.RolePublisher)
	send := func(prefix string) (string, error) {
		var topic string
		err := pgx.BeginFunc(ctx, pub, func(tx pgx.Tx) error {
			var id string
			if err := tx.QueryRow(ctx, `SELECT event_id::text FROM posthorn_send_command('wallet', 'w-1', 'events.x', '{}', topic_prefix => $1)`, prefix).Scan(&id); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT topic FROM posthorn.write('command', 'wallet', 'w-1', 'payouts.payout.execute', '{}')`).Scan(&topic)
		})
		return topic, err
	}
	for _, c := range []struct{ prefix, says string }{
		{"ledger.", "is reserved"}, {"events.", "is reserved"}, {"LEDGER_", "is reserved"}, {"outbox.event.", "is reserved"},
		{"cmd.", "but commands go to the configured 'commands.'"},
	} {
		_, err := send(c.prefix)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.HasPrefix(pgErr.Message, "topic_prefix: ") || !strings.Contains(pgErr.Message, c.says) {
			t.Errorf("topic_prefix %q: %v, want 22023 naming topic_prefix, %q", c.prefix, err, c.says)
		}
	}
	var fe *publish.FieldError
	err := pgx.BeginFunc(ctx, pub, func(tx pgx.Tx) error {
		_, err := publish.Pgx(tx).WithCommandTopicPrefix("ledger.").Command(ctx, publish.Message{AggregateType: "wallet", AggregateID: "w-1", Type: "events.x", Payload: []byte(`{}`)})
		return err
	})
	if !errors.As(err, &fe) || fe.Field != "topic_prefix" {
		t.Errorf("the Go library with prefix ledger.: %v, want a FieldError for topic_prefix", err)
	}
	if n := pgtest.Column[int64](t, owner, `SELECT count(*) FROM outbox`); n[0] != 0 {
		t.Fatalf("the refusals wrote %d outbox rows", n[0])
	}
	// The configured prefix, given or not, is accepted; another is configured by migrate.
	if topic, err := send("commands."); err != nil || topic != "commands.payouts" {
		t.Fatalf("the configured prefix: %q, %v", topic, err)
	}
	if err := postgres.WriteSettings(ctx, url, postgres.Settings{CommandTopicPrefix: "cmd.", IdempotencyKeyTTL: 720 * time.Hour, MaxRecordBytes: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	if topic, err := send("cmd."); err != nil || topic != "cmd.payouts" {
		t.Fatalf("after the prefix is configured to cmd.: %q, %v", topic, err)
	}
	err = postgres.WriteSettings(ctx, url, postgres.Settings{CommandTopicPrefix: "ledger.", IdempotencyKeyTTL: 720 * time.Hour, MaxRecordBytes: 1_000_000})
	if !errors.Is(err, postgres.ErrReservedTopicPrefix) || !strings.Contains(err.Error(), "sink.command_topic_prefix") {
		t.Fatalf("configuring prefix ledger.: %v", err)
	}
	if _, err := owner.Exec(ctx, `UPDATE posthorn.settings SET command_topic_prefix = 'ledger.'`); sqlState(err) != "23514" {
		t.Fatalf("the table's own check of a reserved prefix: %v, want a check violation", err)
	}

	// Control: the previous release's posthorn_send_command.
	oldURL, oldOwner := oldLedger(t)
	mustExec(t, roletest.Pool(t, oldURL), `SELECT * FROM posthorn_send_command('wallet', 'w-1', 'events.x', '{}', topic_prefix => 'ledger.')`)
	if topics := pgtest.Column[string](t, oldOwner, `SELECT topic FROM outbox WHERE aggregate_type = 'wallet'`); len(topics) != 1 || topics[0] != "ledger.events" {
		t.Fatalf("control: the old function put the command on %v, want ledger.events", topics)
	}
}

// migrate's check of schema public: none on PostgreSQL 15's default, the
// grant when every role may create there.
func TestPublicSchemaCreators(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, owner := pgtest.Ledger(t)
	if got, err := postgres.PublicSchemaCreators(ctx, owner); err != nil || len(got) != 0 {
		t.Fatalf("fresh database: %v, %v; want none", got, err)
	}
	mustExec(t, owner, `GRANT CREATE ON SCHEMA public TO PUBLIC`)
	if got, err := postgres.PublicSchemaCreators(ctx, owner); err != nil || len(got) != 1 || got[0] != "PUBLIC" {
		t.Fatalf("after GRANT CREATE TO PUBLIC: %v, %v; want [PUBLIC]", got, err)
	}
}
