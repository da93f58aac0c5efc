package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/netfault"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// A server whose packets stop arriving (the network drops its replies and
// TCP acknowledgements; a partition) fails the statement waiting on it
// within the URL's tcp_user_timeout, so the caller's retry takes a new
// connection instead of waiting about 15 minutes for the operating
// system. Control: tcp_user_timeout=0 (the operating system's) still waits
// when the statement's own 8 s deadline ends it. On a throwaway cluster of
// its own, whose port alone the fault cuts.
func TestAStatementGivesUpOnAServerThatStopsAnswering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.Cluster(t, pgcluster.Options{})
	nf := netfault.New(t)
	for _, control := range []bool{false, true} {
		ms := 2000
		if control {
			ms = 0
		}
		sep := "?"
		if strings.Contains(c.URL("postgres"), "?") {
			sep = "&"
		}
		pool, err := postgres.Connect(ctx, c.URL("postgres")+sep+fmt.Sprintf("tcp_user_timeout=%d", ms), 1)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fault, err := nf.Cut(netfault.Replies, netfault.Link{To: []int{c.Port()}})
		if err != nil {
			t.Fatal(err)
		}
		qctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		began := time.Now()
		_, err = conn.Exec(qctx, `SELECT 1`)
		took := time.Since(began)
		cancel()
		if herr := fault.Heal(); herr != nil {
			t.Fatal(herr)
		}
		conn.Release()
		pool.Close()
		deadline := errors.Is(err, context.DeadlineExceeded) || qctx.Err() != nil && took >= 8*time.Second
		t.Logf("control %v (tcp_user_timeout=%d): the statement ended after %v: %v", control, ms, took.Round(10*time.Millisecond), err)
		switch {
		case err == nil:
			t.Fatalf("control %v: the statement answered through the cut", control)
		case !control && (deadline || took > 6*time.Second):
			t.Fatalf("the statement waited %v for a server that stopped answering, want it ended by the 2 s user timeout: %v", took, err)
		case control && !deadline:
			t.Fatalf("control: the statement ended after %v without its deadline (%v); the test proves nothing", took, err)
		}
	}
}

// A tcp_user_timeout that is not a number of milliseconds is refused and
// named, the URL never echoed.
func TestTCPUserTimeoutMustBeMilliseconds(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"-1", "20s", "x"} {
		_, err := postgres.ParseConfig("postgres://u:secret@127.0.0.1:1/db?tcp_user_timeout=" + v)
		if err == nil || !strings.Contains(err.Error(), "tcp_user_timeout") || strings.Contains(err.Error(), "secret") {
			t.Errorf("tcp_user_timeout=%s: %v", v, err)
		}
	}
}
