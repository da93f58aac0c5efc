// Package sqltest causes an outage of one database on the test server: it
// refuses new connections (ALLOW_CONNECTIONS false) and its sessions are
// terminated (pg_terminate_backend), as if its server went away, while
// every other database of the shared server goes on.
package sqltest

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// Outage cuts off the database of target (a URL from pgtest) and returns
// the function that lets connections in again.
func Outage(t testing.TB, target string) (restore func()) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	db := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	name := strings.TrimPrefix(u.Path, "/")
	admin(t, `ALTER DATABASE `+db+` ALLOW_CONNECTIONS false`)
	admin(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name)
	return func() { admin(t, `ALTER DATABASE `+db+` ALLOW_CONNECTIONS true`) }
}

func admin(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
}
