package relaytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// StandbyName is the application_name of Failover's standby.
const StandbyName = "standby_a"

// Failover is a ledger database on a throwaway primary with an
// asynchronous streaming standby, and a memory sink: the setting of a
// ledger failover that loses the postings the standby missed.
type Failover struct {
	Primary, Standby *pgcluster.Cluster
	// URL and Pool name the ledger on the primary (dead after Promote).
	URL  string
	Pool *pgxpool.Pool
	Sink *memory.Sink
}

// NewFailover starts a primary with opts (synchronous_commit on, so that
// what a relay saw is on the primary's disk: only the standby can lose it),
// creates a migrated ledger database on it, and starts the standby
// StandbyName; everything is removed when the test ends.
func NewFailover(t testing.TB, opts pgcluster.Options) *Failover {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conf := map[string]string{"synchronous_commit": "on"}
	for k, v := range opts.ExtraConf {
		conf[k] = v
	}
	opts.ExtraConf = conf
	p := pgtest.Cluster(t, opts)
	admin, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE ledger"); err != nil {
		t.Fatal(err)
	}
	url := p.URL("ledger")
	if err := postgres.Migrate(ctx, url, postgres.LedgerSchema); err != nil {
		t.Fatal(err)
	}
	s, err := p.StartStandby(ctx, StandbyName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	pool, err := postgres.Connect(ctx, url, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sink := memory.New(memory.Config{})
	t.Cleanup(func() { _ = sink.Close() })
	return &Failover{Primary: p, Standby: s, URL: url, Pool: pool, Sink: sink}
}

// RunRelay starts a relay on the primary's ledger that publishes to
// f.Sink, with standby flush required or off, and returns its metrics and
// a function that stops it.
type RunRelay func(t testing.TB, f *Failover, required bool) (reg prometheus.Gatherer, stop func())

// FailoverResult is what a failover left behind.
type FailoverResult struct {
	// Published counts the distinct events the sink got.
	Published int
	// Ghosts are the published event IDs the promoted standby lacks.
	Ghosts []string
	// WALSenders counts pg_stat_replication's rows while the standby was
	// down (the CDC relay's own WAL sender is one), none of which the
	// relay's probe may take for a standby.
	WALSenders int
}

// RunFailover plays the failover: with the standby streaming, 10 transfers
// (20 events) commit and the relay publishes them; the standby is shut
// down; 20 more transfers commit, and the test waits until the relay has
// published them (off) or reports that it holds them back for the standby
// (required: posthorn_relay_held_by_standby_seconds past one second, their
// events still unpublished); the primary is killed, the standby restarted
// and promoted. It returns what the sink got against the promoted ledger.
func RunFailover(t *testing.T, run RunRelay, required bool, opts pgcluster.Options) FailoverResult {
	t.Helper()
	f := NewFailover(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reg, stop := run(t, f, required)
	before := MustPostTransfers(t, f.Pool, 10, 8, 3)
	f.waitPublished(t, before)
	if err := f.Standby.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	during := MustPostTransfers(t, f.Pool, 20, 8, 5)
	// (The standby's WAL sender may outlive it by a moment.)
	wait.For(t, 30*time.Second, "the relay's probe to see no standby while it is down", func() bool {
		st, err := relaystore.New(f.Pool).StandbyStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(st.Standbys) == 0
	})
	var senders int
	if err := f.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication`).Scan(&senders); err != nil {
		t.Fatal(err)
	}
	if required {
		wait.For(t, 30*time.Second, "the relay to report it is held by the standby", func() bool {
			return promtest.Value(t, reg, "posthorn_relay_held_by_standby_seconds") >= 1
		})
		if n := len(f.published(t, during)); n > 0 {
			t.Errorf("%d events published while the standby was down, want none", n)
		}
	} else {
		f.waitPublished(t, during)
	}
	if err := f.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := f.Standby.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	res := f.ghosts(t, ctx)
	res.WALSenders = senders
	return res
}

// KillPrimaryAndPromote fails the ledger over: the primary is SIGKILLed,
// the standby (stopped while the primary went on alone) started again and
// promoted.
func (f *Failover) KillPrimaryAndPromote(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := f.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := f.Standby.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitPublished waits until every event of posted is in the sink.
func (f *Failover) waitPublished(t testing.TB, posted []Posted) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("%d events published", len(posted)), func() bool {
		return len(f.published(t, posted)) == len(posted)
	})
}

// published returns the events of posted that are in the sink.
func (f *Failover) published(t testing.TB, posted []Posted) []Posted {
	got := map[string]bool{}
	for _, e := range Delivered(t, f.Sink) {
		got[e.EventID] = true
	}
	var out []Posted
	for _, p := range posted {
		if got[p.EventID] {
			out = append(out, p)
		}
	}
	return out
}

// ghosts compares what the sink got with the outbox of the promoted
// standby.
func (f *Failover) ghosts(t testing.TB, ctx context.Context) FailoverResult {
	t.Helper()
	ids := map[string]bool{}
	for _, e := range Delivered(t, f.Sink) {
		ids[e.EventID] = true
	}
	var res FailoverResult
	res.Published = len(ids)
	conn, err := pgx.Connect(ctx, f.Standby.URL("ledger"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for id := range ids {
		var there bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox WHERE event_id = $1)`, id).Scan(&there); err != nil {
			t.Fatal(err)
		}
		if !there {
			res.Ghosts = append(res.Ghosts, id)
		}
	}
	return res
}

// StandbyFlush is relay.standby_flush required (or off) through probe,
// waiting 200ms before a hold is logged.
func StandbyFlush(required bool, probe relay.StandbyProbe) relay.StandbyFlush {
	sf := relay.StandbyFlush{Policy: relay.StandbyOff, Probe: probe, WarnAfter: 200 * time.Millisecond}
	if required {
		sf.Policy = relay.StandbyRequired
	}
	return sf
}

// NoGhostAfterFailover plays RunFailover with standby flush required and,
// as the negative control, off: required must leave no ghost (every event
// published is in the promoted ledger), off must leave some (the scenario
// bites). check, when set, adds a mode's own checks of each run.
func NoGhostAfterFailover(t *testing.T, run RunRelay, opts pgcluster.Options, check func(t *testing.T, required bool, res FailoverResult)) {
	for _, required := range []bool{true, false} {
		t.Run(fmt.Sprintf("required=%v", required), func(t *testing.T) {
			res := RunFailover(t, run, required, opts)
			t.Logf("standby_flush required=%v: %d events published, %d of them absent from the promoted standby", required, res.Published, len(res.Ghosts))
			if res.Published < 20 {
				t.Fatalf("%d events published, want at least the 20 committed while the standby streamed", res.Published)
			}
			if required && len(res.Ghosts) > 0 {
				t.Errorf("%d ghosts (published, absent from the new primary) with standby flush required: %v", len(res.Ghosts), res.Ghosts)
			}
			if !required && len(res.Ghosts) == 0 {
				t.Errorf("negative control: with standby flush off the failover left no ghost; the scenario does not bite")
			}
			if check != nil {
				check(t, required, res)
			}
		})
	}
}
