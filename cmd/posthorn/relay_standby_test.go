package main

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// `posthorn relay` with relay.standby_flush required refuses to start as a
// role that cannot read the standbys' flush positions (it would be held
// for ever), naming the key and the grant it needs.
func TestRelayRefusesAStandbyFlushItCannotRead(t *testing.T) {
	t.Parallel()
	dsn, pool := pgtest.Ledger(t)
	ctx := context.Background()
	role := pool.Config().ConnConfig.Database + "_nostats"
	if _, err := pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role) })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	code, _, stderr := runCLI(t, []string{"POSTHORN_SINK__KIND=memory", "POSTHORN_RELAY__STANDBY_FLUSH=required"}, "relay", "--database.url", u.String())
	if code == 0 || !strings.Contains(stderr, "relay.standby_flush") || !strings.Contains(stderr, "pg_read_all_stats") {
		t.Fatalf("exit %d, stderr %q; want non-zero naming relay.standby_flush and pg_read_all_stats", code, stderr)
	}
}
