// Package roletest runs test code under Posthorn's per-component database
// roles: it applies the grants to a pgtest database and hands out the URL
// of a fresh LOGIN role that is a member of one group role, dropped when
// the test ends.
package roletest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// Ledger returns the URL and the owner's pool of a fresh ledger database
// (pgtest.Ledger) with the group roles' privileges applied.
func Ledger(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	u, owner := pgtest.Ledger(t)
	Apply(t, u, postgres.LedgerSchema)
	return u, owner
}

// Consumer is Ledger for a consumer database.
func Consumer(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	u, owner := pgtest.Consumer(t)
	Apply(t, u, postgres.ConsumerSchema)
	return u, owner
}

// Apply grants the group roles' privileges on schema in the database at dbURL.
func Apply(t testing.TB, dbURL string, schema postgres.Schema) {
	t.Helper()
	if err := postgres.ApplyRoles(context.Background(), dbURL, schema); err != nil {
		t.Fatalf("roletest: %v", err)
	}
}

// Login creates a LOGIN role in group (with password, when not empty) and
// returns dbURL connecting as it. Register it before opening pools on the
// URL, so the role is dropped after they are closed.
func Login(t testing.TB, dbURL string, group postgres.Role, password string) string {
	t.Helper()
	return login(t, dbURL, password, group)
}

// Consumers is Login for a member of the roles of the named consumers
// (postgres.ConsumerRole), which must be registered in the database at
// dbURL: what `posthorn consume` runs as for those consumers.
func Consumers(t testing.TB, dbURL, password string, names ...string) string {
	t.Helper()
	groups := make([]postgres.Role, len(names))
	for i, n := range names {
		r, err := postgres.ConsumerRole(n)
		if err != nil {
			t.Fatalf("roletest: %v", err)
		}
		groups[i] = r
	}
	return login(t, dbURL, password, groups...)
}

func login(t testing.TB, dbURL, password string, groups ...postgres.Role) string {
	t.Helper()
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := "posthorn_t_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, pgtest.ServerURL())
	if err != nil {
		t.Fatalf("roletest: %v", err)
	}
	defer admin.Close(ctx)
	if err := postgres.CreateLogin(ctx, admin, name, password, groups...); err != nil {
		t.Fatalf("roletest: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), pgtest.ServerURL())
		if err != nil {
			t.Errorf("roletest: drop role %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("roletest: drop role %s: %v", name, err)
		}
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("roletest: database URL: %v", err)
	}
	if password != "" {
		u.User = url.UserPassword(name, password)
	} else {
		u.User = url.User(name)
	}
	return u.String()
}

// As opens a small pool on dbURL as a fresh passwordless LOGIN member of
// group (Login, then Pool).
func As(t testing.TB, dbURL string, group postgres.Role) *pgxpool.Pool {
	t.Helper()
	return Pool(t, Login(t, dbURL, group, ""))
}

// Pool opens a small pool on u, closed when the test ends.
func Pool(t testing.TB, u string) *pgxpool.Pool {
	t.Helper()
	return pgtest.SmallPool(t, u, 4)
}

// Denied reports whether err is PostgreSQL's insufficient_privilege (42501).
func Denied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// Refusal is a statement a role must be refused. Each is also run as the
// tables' owner inside a rolled-back transaction: it must succeed there, so
// the refusal is the role's doing, not a broken statement (the negative
// control of every case).
type Refusal struct {
	What string
	SQL  string
}

// AssertRefused runs each case as role, which must be refused (42501),
// and as owner in a rolled-back transaction, which must succeed.
func AssertRefused(t *testing.T, owner, role *pgxpool.Pool, cases []Refusal) {
	t.Helper()
	ctx := context.Background()
	for _, c := range cases {
		_, err := role.Exec(ctx, c.SQL)
		if !Denied(err) {
			t.Errorf("%s: want permission denied (42501), got %v", c.What, err)
		}
		tx, err := owner.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, c.SQL); err != nil {
			t.Errorf("%s: control: the owner's run fails too (%v), so the refusal proves nothing", c.What, err)
		}
		_ = tx.Rollback(ctx)
	}
}
