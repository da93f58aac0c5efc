package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// consumerTransport is a broker the consumer scenarios run over.
type consumerTransport struct {
	name    string
	publish func(t *testing.T, msgs ...*message.Message)
	// subscriber returns a subscriber for one instance of consumer; two
	// instances of one consumer must both receive every message (the race
	// scenario), so instance is part of the Kafka consumer group.
	subscriber func(t *testing.T, consumer string, instance int) message.Subscriber
}

// transports are the brokers every consumer scenario runs over: Watermill's
// in-process gochannel, and kfake over real sockets with watermill-kafka's
// publisher and subscriber.
var transports = []func(t *testing.T) consumerTransport{gochannelTransport, kfakeTransport}

func gochannelTransport(t *testing.T) consumerTransport {
	// Not persistent: subscribers are running before anything is
	// published (startConsumer waits for the router). Publishing does not
	// block on ACKs, so deliveries run concurrently and may be reordered,
	// which the inbox must absorb.
	ch := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ch.Close() })
	return consumerTransport{
		name: "gochannel",
		publish: func(t *testing.T, msgs ...*message.Message) {
			t.Helper()
			if err := ch.Publish(core.TopicEvents, msgs...); err != nil {
				t.Fatal(err)
			}
		},
		subscriber: func(*testing.T, string, int) message.Subscriber { return nopClose{ch} },
	}
}

// nopClose keeps a router's Close from closing the shared gochannel, which
// other instances of the test still use.
type nopClose struct{ message.Subscriber }

func (nopClose) Close() error { return nil }

func kfakeTransport(t *testing.T) consumerTransport {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, core.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	// The relay's Kafka sink writes watermill-kafka's DefaultMarshaler
	// format keyed by the aggregate ID; the test publishes the same way.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers,
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get(core.HeaderAggregateID), nil
		}),
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return consumerTransport{
		name: "kfake",
		publish: func(t *testing.T, msgs ...*message.Message) {
			t.Helper()
			for _, m := range msgs {
				// A fresh copy: the publisher may keep a message's ACK state.
				if err := pub.Publish(core.TopicEvents, m.Copy()); err != nil {
					t.Fatal(err)
				}
			}
		},
		subscriber: func(t *testing.T, consumer string, instance int) message.Subscriber {
			group := consumer
			if instance > 0 {
				// Another group, so that this instance also receives every
				// event: the same situation as a rebalance that hands a
				// partition over while the old owner is still handling it.
				group = fmt.Sprintf("%s-instance-%d", consumer, instance)
			}
			sub, err := kafkagroup.Subscriber(brokers, group, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
	}
}

// smallConsumerPool is a fresh consumer database with a pool of at most 8
// connections (a rig needs about one per consumer and instance), so that
// many parallel tests on a shared server stay under max_connections.
func smallConsumerPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url, _ := pgtest.Consumer(t)
	return pgtest.SmallPool(t, url, 8)
}

// consumerRig is one running instance of the example consumers (and
// optionally a probe that records the order handlers saw).
type consumerRig struct {
	reg  *consumers.Registry
	pool *pgxpool.Pool
	prom *prometheus.Registry
	// stop stops the instance as SIGTERM would (idempotent; cleanup calls it).
	stop func()
}

type rigOptions struct {
	instance   int
	hold       time.Duration
	noInbox    bool
	audit      bool
	probe      bool
	registerer *prometheus.Registry
	// tracer gives the deliveries apply spans; nil is tracing off.
	tracer trace.TracerProvider
}

const probeConsumer = "order-probe"

// startConsumer starts a router with the balance projection (and the
// options' extras) on tr, and stops it at cleanup.
func startConsumer(t *testing.T, tr consumerTransport, pool *pgxpool.Pool, o rigOptions) *consumerRig {
	t.Helper()
	if o.hold == 0 {
		o.hold = 30 * time.Second
	}
	prom := o.registerer
	if prom == nil {
		prom = prometheus.NewRegistry()
	}
	reg := newRegistry(t, pool, 10*time.Second, consumers.Config{
		Subscribers:    func(c string) (message.Subscriber, error) { return tr.subscriber(t, c, o.instance), nil },
		Registerer:     prom,
		HoldTime:       o.hold,
		TracerProvider: o.tracer,
	})
	var extra []consumers.Option
	if o.noInbox {
		extra = append(extra, consumers.WithoutInbox())
	}
	if err := projection.Register(reg, core.TopicEvents, extra...); err != nil {
		t.Fatal(err)
	}
	if o.audit {
		if err := auditlog.Register(reg, core.TopicEvents); err != nil {
			t.Fatal(err)
		}
	}
	if o.probe {
		ensureProbeTable(t, pool)
		if err := reg.AddEventHandler(probeConsumer, core.TopicEvents, probeHandler, consumers.DependsOnPredecessor()); err != nil {
			t.Fatal(err)
		}
	}
	stop := runRegistry(t, reg, t.Errorf)
	return &consumerRig{reg: reg, pool: pool, prom: prom, stop: stop}
}

// runRegistry runs reg until the returned stop is called (cleanup calls
// it too; it is idempotent) and returns once its router is running. report
// receives the error Run ended with: t.Errorf, or t.Logf where an outage
// may end the run with one.
func runRegistry(tb testing.TB, reg *consumers.Registry, report func(string, ...any)) (stop func()) {
	tb.Helper()
	stop, ended := runInBackground(tb, context.Background(), reg.Run, report)
	select {
	case <-reg.Running():
	case <-ended:
		stop() // reports what Run returned
		tb.Fatal("consumer stopped before running")
	case <-time.After(30 * time.Second):
		tb.Fatal("consumer router did not start")
	}
	return stop
}

// newRegistry is a consumers.Registry over pool, its inbox included, on a
// router of its own, which waits closeTimeout for in-flight handlers and
// runs mw around them; the subscribers cfg.Subscribers makes are closed at
// cleanup (closedAtCleanup).
func newRegistry(tb testing.TB, pool *pgxpool.Pool, closeTimeout time.Duration, cfg consumers.Config, mw ...message.HandlerMiddleware) *consumers.Registry {
	tb.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: closeTimeout}, watermill.NopLogger{})
	if err != nil {
		tb.Fatal(err)
	}
	router.AddMiddleware(mw...)
	cfg.Pool = pool
	if cfg.Inbox == nil {
		cfg.Inbox = inboxstore.New(pool)
	}
	cfg.Subscribers = closedAtCleanup(tb, cfg.Subscribers)
	reg, err := consumers.New(router, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return reg
}

// closedAtCleanup closes at cleanup every subscriber f returns. A plain
// router stopped through its context may leave its subscribers open
// (Watermill's handler closes them only when Router.Close wins the race),
// and a Kafka group member, a NATS or AMQP connection or a pool then runs
// on. consumers.Registry.Run closes what its factory made itself; this
// also covers a registry a test builds and never runs.
func closedAtCleanup(tb testing.TB, f consumers.SubscriberFactory) consumers.SubscriberFactory {
	return func(consumer string) (message.Subscriber, error) {
		sub, err := f(consumer)
		if err == nil {
			tb.Cleanup(func() { _ = sub.Close() })
		}
		return sub, err
	}
}

// runInBackground runs run (a router's or a registry's Run) under a child
// of ctx until stop is called; tb's cleanup calls stop too, and stop is
// idempotent, so a test may stop early. stop cancels, waits for run to
// return and hands its error to report (unless nil). ended is closed when
// run has returned.
func runInBackground(tb testing.TB, ctx context.Context, run func(context.Context) error, report func(string, ...any)) (stop func(), ended <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var err error
	go func() { err = run(ctx); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if err != nil {
				report("consumer run: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop, done
}

var probeOnce sync.Map

func ensureProbeTable(t *testing.T, pool *pgxpool.Pool) {
	if _, loaded := probeOnce.LoadOrStore(pool, true); loaded {
		return
	}
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE IF NOT EXISTS probe_applied (n bigserial PRIMARY KEY, account text, revision bigint)`); err != nil {
		t.Fatal(err)
	}
}

// probeHandler records the order in which an ordered consumer applied
// each account's revisions.
func probeHandler(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
	_, err := tx.Exec(ctx, `INSERT INTO probe_applied (account, revision) VALUES ($1, $2)`, e.AggregateID, e.Revision)
	return err
}

func probeOrder(t *testing.T, pool *pgxpool.Pool, account string) []int64 {
	t.Helper()
	return pgtest.Column[int64](t, pool, `SELECT revision FROM probe_applied WHERE account = $1 ORDER BY n`, account)
}

// posted builds the ledger.account.posted event of one account revision.
// Event IDs are deterministic so a resend or replay carries the same one.
func posted(run, account string, rev int64, currency string, delta int64) *message.Message {
	id := fmt.Sprintf("%s-%s-%d", run, account, rev)
	p := core.AccountPosted{EventID: id, JournalID: "j-" + id, Account: account, Revision: rev,
		Currency: currency, Delta: fmt.Sprint(delta), PostedAt: time.Now().UTC()}
	payload, _ := json.Marshal(p)
	return core.Envelope{
		EventID: id, Kind: core.KindEvent, Type: core.TypeAccountPosted, Topic: core.TopicEvents,
		AggregateType: core.AggregateAccount, AggregateID: account, Revision: rev, JournalID: p.JournalID,
		OccurredAt: p.PostedAt, Payload: payload,
	}.ToMessage()
}

// postedRun is posted for accounts accounts (prefix-0, prefix-1, …) at
// revisions 1 to revisions, every account's revision r before any
// revision r+1, account a's revision rev moving its currency balance by
// delta(a, rev); want is the balance each account ends at.
func postedRun(run, prefix, currency string, accounts int, revisions int64, delta func(a int, rev int64) int64) (msgs []*message.Message, want map[string]int64) {
	want = map[string]int64{}
	for rev := int64(1); rev <= revisions; rev++ {
		for a := range accounts {
			acc := fmt.Sprintf("%s-%d", prefix, a)
			d := delta(a, rev)
			want[acc] += d
			msgs = append(msgs, posted(run, acc, rev, currency, d))
		}
	}
	return msgs, want
}

func counts(t *testing.T, pool *pgxpool.Pool, consumer string) inboxstore.Counts {
	t.Helper()
	c, err := inboxstore.New(pool).Count(context.Background(), consumer)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func balance(t *testing.T, pool *pgxpool.Pool, account, currency string) int64 {
	t.Helper()
	var b *big.Int
	bs, err := projection.Balances(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if b = bs[account][currency]; b == nil {
		return 0
	}
	return b.Int64()
}

func disposition(t *testing.T, pool *pgxpool.Pool, consumer, eventID string) core.Disposition {
	t.Helper()
	recs, err := inboxstore.New(pool).Dispositions(context.Background(), consumer, []string{eventID})
	if err != nil {
		t.Fatal(err)
	}
	return recs[eventID].Disposition
}
