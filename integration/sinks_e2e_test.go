package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/amqptest"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/redistest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/sqltest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// sinkBroker is one broker kind, configured for one test, with a way to
// take it down and bring it back.
type sinkBroker struct {
	sink brokers.Config
	// down takes the broker away and returns the function that brings it back.
	down func(t *testing.T) (up func())
	// consumerOutageRaces says why the outage while the consumer reads is
	// skipped under the race detector ("" when it is not).
	consumerOutageRaces string
}

// sinkBrokers builds each broker kind on a server the test may take down
// without disturbing other tests:
//   - nats: a dedicated nats-server, killed (SIGKILL) and started again on
//     its port and JetStream store;
//   - redis: a dedicated redis-server with appendonly yes, appendfsync
//     always, killed and started again on its AOF;
//   - amqp: a dedicated RabbitMQ node, killed (SIGKILL to its beam
//     process group) and started again on its data directory; under the
//     race detector (watermill issue 693) or where no node can be started,
//     the machine's node in a vhost whose permissions are withdrawn and
//     whose connections are closed, logged loudly as simulated;
//   - postgres: a fresh target database on the machine's server that
//     refuses connections and has its sessions terminated.
var sinkBrokers = map[string]func(t *testing.T) sinkBroker{
	"nats": func(t *testing.T) sinkBroker {
		srv := natstest.Start(t)
		sc := brokers.Config{}
		sc.Kind, sc.NATS.URL = "nats", srv.URL
		return sinkBroker{sink: sc, down: func(*testing.T) func() { srv.Kill(); return srv.StartAgain }}
	},
	"redis": func(t *testing.T) sinkBroker {
		srv := redistest.Start(t)
		sc := brokers.Config{}
		sc.Kind, sc.Redis.Addr = "redis", srv.Addr
		return sinkBroker{sink: sc, down: func(*testing.T) func() { srv.Kill(); return srv.StartAgain }}
	},
	"amqp": func(t *testing.T) sinkBroker {
		sc := brokers.Config{}
		sc.Kind = "amqp"
		var down func(t *testing.T) func()
		why := amqptest.NodeUnavailable()
		if why == "" && sinksRaceDetector {
			// Closing a watermill-amqp subscriber whose node really went
			// away trips its known reconnect race (watermill issue 693)
			// under -race; `make test` runs this test again without -race
			// for the real restart.
			why = "the race detector is on (watermill issue 693)"
		}
		if why != "" {
			t.Logf("!!! AMQP OUTAGE IS SIMULATED (vhost permissions withdrawn), NOT A BROKER RESTART: %s", why)
			v := amqptest.NewVhost(t)
			sc.AMQP.URL = v.URL
			down = func(t *testing.T) func() { return v.Outage(t) }
		} else {
			n := amqptest.StartNode(t)
			sc.AMQP.URL = n.URL
			down = func(*testing.T) func() { n.Kill(); return n.StartAgain }
		}
		sc.AMQP.Consumers = []string{projection.Name}
		sc.AMQP.ExchangePrefix = amqptest.Prefix(t, sc.AMQP.URL, []string{core.TopicEvents}, sc.AMQP.Consumers)
		return sinkBroker{sink: sc, down: down,
			// github.com/ThreeDotsLabs/watermill issue 693 (open): the
			// subscriber's reconnect writes ConnectionWrapper.connected
			// while IsConnected reads it. It does not lose messages (the run
			// passes without -race), but -race fails the test.
			consumerOutageRaces: "watermill-amqp v3.0.2's subscriber reconnect has a known data race (watermill issue 693)"}
	},
	"postgres": func(t *testing.T) sinkBroker {
		sc := brokers.Config{}
		sc.Kind, sc.Postgres.URL = "postgres", pgtest.NewDatabase(t)
		return sinkBroker{sink: sc, down: func(t *testing.T) func() { return sqltest.Outage(t, sc.Postgres.URL) }}
	},
}

// TestSinksEndToEndBrokerRestart, per broker kind: postings through the
// ledger's write path → relay → broker → the balance projection with its
// inbox; the broker goes down mid-run while postings go on, and comes back.
// Nothing is lost: every event is applied once, no account is parked, and
// the projection's balances equal the ledger's.
func TestSinksEndToEndBrokerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts broker processes")
	}
	for _, kind := range []string{"nats", "amqp", "redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := sinkBrokers[kind](t)
			if missing, notApplied := runSinkEndToEnd(t, b); missing != 0 || notApplied != 0 {
				t.Fatalf("across the broker restarts %d events lost, %d not applied", missing, notApplied)
			}
		})
	}
}

// TestSinksEndToEndRedisWithoutPersistenceLoses is the negative control of
// the restart test: the same run against a redis-server that keeps nothing
// on disk (the machine's shared Redis is configured this way) loses the
// entries its restart wipes, although every one was ACKed by XADD. The
// ACK is only as durable as the broker's configuration.
func TestSinksEndToEndRedisWithoutPersistenceLoses(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts broker processes")
	}
	t.Parallel()
	srv := redistest.StartVolatile(t)
	sc := brokers.Config{}
	sc.Kind, sc.Redis.Addr = "redis", srv.Addr
	missing, _ := runSinkEndToEnd(t, sinkBroker{sink: sc, down: func(*testing.T) func() { srv.Kill(); return srv.StartAgain }})
	if missing == 0 {
		t.Fatal("control: a Redis without persistence lost nothing across a crash; the restart test proves nothing")
	}
	t.Logf("control: %d ACKed events lost with the broker's memory", missing)
}

// runSinkEndToEnd runs the scenario and returns how many committed events
// never reached the consumer, and how many were not applied (both 0 when
// the run is sound; then it also checks the balances).
func runSinkEndToEnd(t *testing.T, b sinkBroker) (missing, notApplied int) {
	ctx := context.Background()
	_, ledgerPool := pgtest.Ledger(t)
	_, consumerPool := pgtest.Consumer(t)
	store := ledgerstore.New(ledgerPool, ledgerstore.Config{})

	sink, err := brokers.OpenSink(b.sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.Close() })
	_, reg := startTestRelay(t, ledgerPool, sink, "e2e-"+b.sink.Kind, b.sink.Kind)
	rng := rand.New(rand.NewPCG(7, uint64(len(b.sink.Kind))))
	next := 0
	post := func(n int) {
		for range n {
			a, c := rng.IntN(12), rng.IntN(11)
			if c >= a {
				c++
			}
			cur := []string{"EUR", "USD"}[rng.IntN(2)]
			amount := int64(1 + rng.IntN(10000))
			if _, _, err := store.Post(ctx, fmt.Sprintf("e2e-%d", next), core.Posting{Entries: []core.Entry{
				{Account: fmt.Sprintf("acc-%02d", a), Direction: core.Debit, Amount: amount, Currency: cur},
				{Account: fmt.Sprintf("acc-%02d", c), Direction: core.Credit, Amount: amount, Currency: cur},
			}}); err != nil {
				t.Fatalf("posting %d: %v", next, err)
			}
			next++
		}
	}
	applied := func() int64 { return counts(t, consumerPool, projection.Name).Events[core.DispositionApplied] }
	outage := func(what string, during int) {
		t.Helper()
		up := b.down(t)
		retries := promtest.Value(t, reg, "posthorn_relay_retries_total")
		post(during)
		wait.ForStatus(t, 30*time.Second, "the relay to retry during "+what, func() (bool, string) {
			return promtest.Value(t, reg, "posthorn_relay_retries_total") > retries, "no retry yet"
		})
		if n := relaytest.Unrelayed(t, ledgerPool); n == 0 {
			t.Fatalf("%s: every row relayed during the outage: the broker was not down", what)
		}
		up()
	}

	// 1. Events the broker ACKed and nobody has read yet survive its crash:
	// the consumers start only after the restart.
	post(150)
	wait.ForStatus(t, 60*time.Second, "every event ACKed before the first outage", func() (bool, string) {
		n := relaytest.Unrelayed(t, ledgerPool)
		return n == 0, fmt.Sprintf("unrelayed %d", n)
	})
	outage("the first outage (no consumer running)", 100)
	// 2. The broker goes down again while the consumer reads: both sides
	// reconnect, and what was in flight is redelivered.
	startSinkConsumer(t, b.sink, consumerPool)
	post(100)
	// Seen, not applied: after a loss the gap check holds what follows it.
	seen := func() (n int64) {
		for _, v := range counts(t, consumerPool, projection.Name).Events {
			n += v
		}
		return n
	}
	wait.ForStatus(t, 60*time.Second, "the consumer to receive events before the second outage", func() (bool, string) {
		return seen() > 0, "none received"
	})
	if b.consumerOutageRaces != "" && sinksRaceDetector {
		t.Logf("skipping the outage while the consumer reads under -race: %s; run without -race to cover it", b.consumerOutageRaces)
		post(50)
	} else {
		outage("the second outage (consumer running)", 50)
	}
	post(50)
	total := int64(countEvents(t, ledgerPool))
	// All marked means the relay has every ACK; then wait for the consumer
	// to go quiet (a lost event never arrives).
	wait.ForStatus(t, 90*time.Second, "the backlog to drain after the restart", func() (bool, string) {
		n := relaytest.Unrelayed(t, ledgerPool)
		return n == 0, fmt.Sprintf("unrelayed %d", n)
	})
	var last int64 = -1
	stable := time.Now()
	wait.ForStatus(t, 90*time.Second, "the projection to apply every event or stop moving", func() (bool, string) {
		a := applied()
		if a != last {
			last, stable = a, time.Now()
		}
		return a == total || time.Since(stable) > 15*time.Second, fmt.Sprintf("applied %d of %d", a, total)
	})
	c := counts(t, consumerPool, projection.Name)
	if a := c.Events[core.DispositionApplied]; a != total {
		missing := total - seen()
		t.Logf("%s: %d of %d events applied; %d never delivered, %d held or parked behind the gaps", b.sink.Kind, a, total, missing, total-a-missing)
		return int(missing), int(total - a)
	}
	if c.ParkedAggregates != 0 {
		t.Fatalf("parked aggregates %d: %+v", c.ParkedAggregates, c)
	}
	accounts := checkBalances(t, ledgerPool, consumerPool)
	t.Logf("%s: %d events applied, %d duplicates absorbed, balances of %d accounts equal", b.sink.Kind, total, c.DuplicatesAbsorbed, accounts)
	return 0, 0
}

// checkBalances fails t unless the balance projection in consumerPool
// equals every balance of the ledger; it returns how many accounts it
// compared.
func checkBalances(t *testing.T, ledgerPool, consumerPool *pgxpool.Pool) int {
	t.Helper()
	proj, err := projection.Balances(context.Background(), consumerPool)
	if err != nil {
		t.Fatal(err)
	}
	ledger := ledgerBalances(t, ledgerPool)
	for acc, curs := range ledger {
		for cur, v := range curs {
			got := proj[acc][cur]
			if (got == nil && v != 0) || (got != nil && got.Int64() != v) {
				t.Fatalf("%s %s: projection %v, ledger %d", acc, cur, got, v)
			}
		}
	}
	if len(ledger) == 0 {
		t.Fatal("no ledger balances: the comparison proves nothing")
	}
	return len(ledger)
}

func startSinkConsumer(t *testing.T, sc brokers.Config, pool *pgxpool.Pool) {
	t.Helper()
	factory, err := brokers.Subscribers(sc, brokers.Options{Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t, pool, 10*time.Second, consumers.Config{Subscribers: factory, Registerer: prometheus.NewRegistry(), HoldTime: time.Minute})
	if err := projection.Register(reg, core.TopicEvents); err != nil {
		t.Fatal(err)
	}
	// A broker outage may end the run with an error; the checks are on
	// what was applied.
	runRegistry(t, reg, t.Logf)
}

func countEvents(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE kind = 'event'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ledgerBalances reads every balance of the ledger by account and currency.
func ledgerBalances(t *testing.T, pool *pgxpool.Pool) map[string]map[string]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT account_id, currency, balance FROM account_balances`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]map[string]int64{}
	for rows.Next() {
		var acc, cur string
		var bal int64
		if err := rows.Scan(&acc, &cur, &bal); err != nil {
			t.Fatal(err)
		}
		if out[acc] == nil {
			out[acc] = map[string]int64{}
		}
		out[acc][cur] = bal
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
