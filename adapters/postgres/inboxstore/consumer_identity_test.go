package inboxstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
)

// projectionEffect is balance-projection's effect for one test event: +100
// to acc-bob, at the event's revision.
func projectionEffect(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
	_, err := tx.Exec(ctx, `INSERT INTO projection_balances (account, currency, balance, revision) VALUES ($1, 'EUR', 100, $2)
ON CONFLICT (account, currency) DO UPDATE SET balance = projection_balances.balance + 100, revision = EXCLUDED.revision`,
		e.AggregateID, e.Revision)
	return err
}

// receiveAs calls posthorn_inbox_receive for consumer in its own
// transaction, committing what it answers; the error is the database's.
func receiveAs(ctx context.Context, pool *pgxpool.Pool, consumer string, e core.Envelope) (string, error) {
	h, err := json.Marshal(e.WireHeaders())
	if err != nil {
		return "", err
	}
	var d string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT disposition FROM posthorn_inbox_receive($1, $2::text::jsonb)`, consumer, string(h)).Scan(&d)
	})
	return d, err
}

// rlsRefused reports the refusal of a write that row-level security does
// not allow (42501, "new row violates row-level security policy").
func rlsRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// TestSecurityConsumerCannotAnswerForAnother: a role that runs one
// consumer (audit-log), and a role in posthorn_consumer only, try to speak
// for balance-projection: record a disposition for an event the projection
// has not applied yet (through the SQL function, through the Go inbox, and
// with a temporary consumer_identities of their own), change its balances,
// delete its inbox rows, move its position, set its retention horizon.
// Each is refused or touches nothing, the projection then applies the
// event itself, and each role still does its own work. The control is the
// grants before consumers had roles of their own (no row security, the
// projection's table granted to posthorn_consumer): the same call answers
// apply, and the projection then counts the real event as a duplicate and
// never applies its +100.
func TestSecurityConsumerCannotAnswerForAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Consumer(t)
	projection := roletest.Pool(t, roletest.Consumers(t, url, "", "balance-projection"))
	audit := roletest.Pool(t, roletest.Consumers(t, url, "", "audit-log"))
	plain := roletest.As(t, url, postgres.RoleConsumer)
	reconciler := roletest.As(t, url, postgres.RoleReconciler)
	projInbox := inboxstore.New(projection)

	// A consumer refuses to start under a login that cannot answer for it.
	for _, c := range []struct {
		pool *pgxpool.Pool
		says string
	}{
		{owner, ""}, {projection, ""},
		{audit, `consumer "balance-projection": this login is not a member of its role posthorn_consumer_balance_projection`},
		{projection, `consumer "invoices" has no role`},
	} {
		names := []string{"balance-projection"}
		if strings.Contains(c.says, "invoices") {
			names = []string{"invoices"}
		}
		err := postgres.CheckConsumerRoles(ctx, c.pool, names)
		if (c.says == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.says)) {
			t.Fatalf("CheckConsumerRoles(%v): %v, want %q", names, err, c.says)
		}
	}

	first, second := inboxEvent("acc-bob", 1), inboxEvent("acc-bob", 2)
	if out, err := projInbox.Receive(ctx, "balance-projection", true, first, projectionEffect); err != nil || out.Disposition != core.DispositionApplied {
		t.Fatalf("the projection's own first event: %+v %v", out, err)
	}

	for _, attacker := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"audit-log's role", audit}, {"posthorn_consumer alone", plain}} {
		if d, err := receiveAs(ctx, attacker.pool, "balance-projection", second); !rlsRefused(err) {
			t.Errorf("%s: posthorn_inbox_receive as balance-projection answered %q, %v; want refused (42501)", attacker.name, d, err)
		}
		called := false
		out, err := inboxstore.New(attacker.pool).Receive(ctx, "balance-projection", true, second, func(context.Context, pgx.Tx, core.Envelope) error {
			called = true
			return nil
		})
		if err == nil || called {
			t.Errorf("%s: the Go inbox as balance-projection: %+v, handler called %v, err %v; want refused", attacker.name, out, called, err)
		}
		if _, err := attacker.pool.Exec(ctx, `UPDATE projection_balances SET balance = balance + 100000000`); !roletest.Denied(err) {
			t.Errorf("%s: UPDATE projection_balances: %v, want permission denied", attacker.name, err)
		}
		for _, q := range []string{
			`DELETE FROM consumer_inbox WHERE consumer = 'balance-projection'`,
			`UPDATE consumer_positions SET last_revision = 99 WHERE consumer = 'balance-projection'`,
			`UPDATE consumer_inbox SET disposition = 'duplicate' WHERE consumer = 'balance-projection'`,
		} {
			tag, err := attacker.pool.Exec(ctx, q)
			if err != nil || tag.RowsAffected() != 0 {
				t.Errorf("%s: %s: %d rows, %v; want none", attacker.name, q, tag.RowsAffected(), err)
			}
		}
		if _, err := attacker.pool.Exec(ctx, `INSERT INTO consumer_retention (consumer, ordered_before, unordered_before) VALUES ('balance-projection', now(), now())`); !rlsRefused(err) {
			t.Errorf("%s: set balance-projection's retention horizon: %v, want refused", attacker.name, err)
		}
	}
	// A temporary table of the caller's comes first on its search_path,
	// but the policies were bound to the real one when they were created.
	err := pgx.BeginFunc(ctx, audit, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TEMP TABLE consumer_identities (consumer text, role name) ON COMMIT DROP;
INSERT INTO consumer_identities SELECT 'balance-projection', r.rolname FROM pg_roles r WHERE pg_has_role(r.oid, 'MEMBER') AND r.rolname LIKE 'posthorn_consumer_%'`); err != nil {
			return err
		}
		h, _ := json.Marshal(second.WireHeaders())
		_, err := tx.Exec(ctx, `SELECT posthorn_inbox_receive('balance-projection', $1::text::jsonb)`, string(h))
		return err
	})
	if !rlsRefused(err) {
		t.Errorf("audit-log's role with a temporary consumer_identities: %v, want refused", err)
	}

	// Nothing of the projection's moved: it applies the event itself.
	if got := pgtest.Column[int64](t, owner, `SELECT count(*) FROM consumer_inbox WHERE consumer = 'balance-projection'`); got[0] != 1 {
		t.Fatalf("balance-projection's inbox rows after the attacks: %d, want 1", got[0])
	}
	if out, err := projInbox.Receive(ctx, "balance-projection", true, second, projectionEffect); err != nil || out.Disposition != core.DispositionApplied {
		t.Fatalf("the projection's own second event after the attacks: %+v %v, want applied", out, err)
	}
	if b := pgtest.Column[int64](t, owner, `SELECT balance FROM projection_balances WHERE account = 'acc-bob'`); b[0] != 200 {
		t.Fatalf("acc-bob's projected balance %d, want 200", b[0])
	}
	// Each still does its own work, and reconciliation reads everyone's.
	if d, err := receiveAs(ctx, audit, "audit-log", first); err != nil || d != "apply" {
		t.Fatalf("audit-log's role on its own inbox: %q %v", d, err)
	}
	if _, err := audit.Exec(ctx, `INSERT INTO audit_log (event_id, type, aggregate_type, aggregate_id, revision, payload)
VALUES ('e-audit', 't', 'account', 'acc-bob', 2, '{}')`); err != nil {
		t.Fatalf("audit-log's role writing audit_log: %v", err)
	}
	if got := pgtest.Column[int64](t, reconciler, `SELECT count(*) FROM consumer_inbox`); got[0] != 3 {
		t.Fatalf("the reconciler sees %d inbox rows, want all 3", got[0])
	}

	// Control: the grants before consumers had roles of their own.
	if _, err := owner.Exec(ctx, `ALTER TABLE consumer_inbox DISABLE ROW LEVEL SECURITY;
ALTER TABLE consumer_positions DISABLE ROW LEVEL SECURITY;
GRANT SELECT, INSERT, UPDATE ON projection_balances, audit_log TO posthorn_consumer`); err != nil {
		t.Fatal(err)
	}
	third := inboxEvent("acc-bob", 3)
	if d, err := receiveAs(ctx, audit, "balance-projection", third); err != nil || d != "apply" {
		t.Fatalf("control: audit-log's role answering for balance-projection: %q %v; the old grants must let it", d, err)
	}
	out, err := projInbox.Receive(ctx, "balance-projection", true, third, projectionEffect)
	if err != nil || out.Disposition != core.DispositionDuplicate {
		t.Fatalf("control: the projection's own third event: %+v %v; want a duplicate (the attack bites)", out, err)
	}
	if b := pgtest.Column[int64](t, owner, `SELECT balance FROM projection_balances WHERE account = 'acc-bob'`); b[0] != 200 {
		t.Fatalf("control: acc-bob's projected balance %d, want 200 (the +100 of revision 3 lost)", b[0])
	}
	if _, err := audit.Exec(ctx, `UPDATE projection_balances SET balance = balance + 100000000`); err != nil {
		t.Fatalf("control: audit-log's role changing the projection under the old grants: %v", err)
	}
	t.Logf("control (the old grants): another consumer's role recorded apply for balance-projection, which then dropped the real event as a duplicate and took a forged balance")
}

// TestRegisterConsumersIsOneToOne: a registered name gets its role, a
// second registration of it is a no-op, a name that maps to a taken role
// is refused naming both, and a name too long for a role is refused.
func TestRegisterConsumersIsOneToOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := pgtest.Consumer(t)
	roles, err := postgres.RegisterConsumers(ctx, url, "invoices", "invoices")
	if err != nil || len(roles) != 2 || roles[0] != "posthorn_consumer_invoices" {
		t.Fatalf("register invoices: %v %v", roles, err)
	}
	_, err = postgres.RegisterConsumers(ctx, url, "wallets", "Invoices")
	if err == nil || !strings.Contains(err.Error(), `consumer "Invoices": its role posthorn_consumer_invoices already answers for consumer "invoices"`) {
		t.Fatalf("a name sharing invoices' role: %v", err)
	}
	// All or none: wallets was not registered either.
	if n := pgtest.Column[int64](t, owner, `SELECT count(*) FROM consumer_identities WHERE consumer = 'wallets'`); n[0] != 0 {
		t.Fatalf("wallets registered by a refused run")
	}
	if _, err := postgres.RegisterConsumers(ctx, url, strings.Repeat("x", 46)); !errors.Is(err, postgres.ErrBadConsumerName) {
		t.Fatalf("a 46-character name: %v", err)
	}
}
