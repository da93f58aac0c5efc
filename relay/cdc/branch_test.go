package cdc_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay/cdc"
)

// multiHost is one URL naming both servers, read-write sessions only, as
// an operator points the relay at a ledger that may fail over.
func multiHost(t *testing.T, primary, standby string) string {
	t.Helper()
	p, err := url.Parse(primary)
	if err != nil {
		t.Fatal(err)
	}
	s, err := url.Parse(standby)
	if err != nil {
		t.Fatal(err)
	}
	p.Host += "," + s.Host
	q := p.Query()
	q.Set("target_session_attrs", "read-write")
	p.RawQuery = q.Encode()
	return p.String()
}

// TestCDCRelayNamesWhatItPublishedPastTheBranchPoint: a CDC relay follows
// its ledger through a failover to an asynchronous standby (a multi-host
// URL). With relay.standby_flush off it published events the standby never
// received; on the promoted standby it finds the timeline changed, reads
// where the new history branched off, and names at ERROR every event it
// published past that point: exactly the ghosts (on the wire, not in the
// ledger), counted in posthorn_cdc_published_past_branch_point_total. The
// control is the same failover with standby_flush required: nothing was
// published past the branch point, and it says so, naming none.
func TestCDCRelayNamesWhatItPublishedPastTheBranchPoint(t *testing.T) {
	for _, required := range []bool{false, true} {
		t.Run(fmt.Sprintf("standby_flush_required=%v", required), func(t *testing.T) {
			ctx := context.Background()
			f := relaytest.NewFailover(t, pgcluster.Options{Logical: true})
			pool, err := postgres.Connect(ctx, multiHost(t, f.URL, f.Standby.URL("ledger")), 8)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			logs := &syncbuf.Buffer{}
			reg := prometheus.NewRegistry()
			store := relaystore.New(pool)
			r, err := cdc.New(store, cdcsource.New(pool), f.Sink, failoverCDCConfig("branch", store, logs, reg, required))
			if err != nil {
				t.Fatal(err)
			}
			relaytest.Start(t, r)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("relay logs:\n%s", logs)
				}
			})
			wait.For(t, 30*time.Second, "the relay to stream", func() bool {
				return strings.Contains(logs.String(), "streaming the outbox from the slot")
			})
			published := func(posted []relaytest.Posted) int {
				got := map[string]bool{}
				for _, e := range relaytest.Delivered(t, f.Sink) {
					got[e.EventID] = true
				}
				n := 0
				for _, p := range posted {
					if got[p.EventID] {
						n++
					}
				}
				return n
			}
			before := relaytest.MustPostTransfers(t, f.Pool, 10, 8, 3)
			wait.For(t, 30*time.Second, "the first events published", func() bool { return published(before) == len(before) })
			if err := f.Standby.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			during := relaytest.MustPostTransfers(t, f.Pool, 20, 8, 5)
			if required {
				wait.For(t, 30*time.Second, "the relay to be held by the standby", func() bool {
					return promtest.Value(t, reg, "posthorn_relay_held_by_standby_seconds") >= 1
				})
			} else {
				wait.For(t, 30*time.Second, "the events of the lost tail published", func() bool { return published(during) == len(during) })
			}
			f.KillPrimaryAndPromote(t)
			const named, none = "CDC RELAY PUBLISHED PAST THE NEW HISTORY'S BRANCH POINT", "nothing this relay published is past the new history's branch point"
			wait.For(t, time.Minute, "the relay to compare with the branch point", func() bool {
				return strings.Contains(logs.String(), named) || strings.Contains(logs.String(), none)
			})
			// The ghosts: published, absent from the promoted standby.
			inLedger := map[string]bool{}
			rows, err := pool.Query(ctx, `SELECT event_id::text FROM outbox`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				inLedger[id] = true
			}
			rows.Close()
			var ghosts []string
			for _, e := range relaytest.Delivered(t, f.Sink) {
				if !inLedger[e.EventID] {
					ghosts = append(ghosts, e.EventID)
				}
			}
			log := logs.String()
			counted := promtest.Value(t, reg, "posthorn_cdc_published_past_branch_point_total")
			t.Logf("standby_flush required=%v: %d ghosts, %v named past the branch point", required, len(ghosts), counted)
			if required {
				if len(ghosts) != 0 || strings.Contains(log, named) || counted != 0 {
					t.Fatalf("control: %d ghosts, %v named; want none", len(ghosts), counted)
				}
				return
			}
			if len(ghosts) == 0 {
				t.Fatalf("the failover left no ghost: the scenario does not bite")
			}
			if !strings.Contains(log, named) || int(counted) != len(ghosts) {
				t.Fatalf("%d ghosts, %v named past the branch point", len(ghosts), counted)
			}
			for _, id := range ghosts {
				if !strings.Contains(log, id) {
					t.Fatalf("ghost %s is not named in the log", id)
				}
			}
		})
	}
}
