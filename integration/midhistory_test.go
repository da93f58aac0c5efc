package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// postTransfers posts n transfers between accounts acc-0 … acc-(accounts-1)
// through the ledger's write path (the projection's real payloads).
func postTransfers(t *testing.T, pool *pgxpool.Pool, prefix string, n, accounts int) {
	t.Helper()
	store := ledgerstore.New(pool, ledgerstore.Config{})
	for i := range n {
		amount := int64(100 + i)
		if _, _, err := store.Post(context.Background(), fmt.Sprintf("%s-%d", prefix, i), core.Posting{Entries: []core.Entry{
			{Account: fmt.Sprintf("acc-%d", i%accounts), Direction: core.Debit, Amount: amount, Currency: "EUR"},
			{Account: fmt.Sprintf("acc-%d", (i+3)%accounts), Direction: core.Credit, Amount: amount, Currency: "EUR"},
		}}); err != nil {
			t.Fatal(err)
		}
	}
}

// midHistory is a ledger whose first events were relayed to ledger.events
// long ago: the relay runs on it, and relayed waits until every row is.
type midHistory struct {
	ledger *pgxpool.Pool
	b      *relayBroker
}

func startMidHistory(t *testing.T) *midHistory {
	t.Helper()
	_, pool := pgtest.Ledger(t)
	m := &midHistory{ledger: pool, b: startRelayBroker(t)}
	startKafkaRelay(t, pool, m.b.addrs, "relay-mid-history")
	return m
}

func (m *midHistory) relayed(t *testing.T) {
	t.Helper()
	wait.For(t, 30*time.Second, "every row relayed", func() bool { return relaytest.Unrelayed(t, m.ledger) == 0 })
}

// forget deletes every record of ledger.events so far, as the topic's
// retention does with old ones.
func (m *midHistory) forget(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(m.b.addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, core.TopicEvents)
	if err != nil {
		t.Fatal(err)
	}
	var to kadm.Offsets
	ends.Each(func(o kadm.ListedOffset) { to.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset}) })
	res, err := adm.DeleteRecords(ctx, to)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("delete the topic's old records: %v", err)
	}
}

// startProjection runs a fresh balance projection on topics of the
// broker, holding an event ahead of its predecessor for hold. Each call is
// a Kafka consumer group of its own (the consumer's name and group), so a
// second projection reads the topics from their start too.
func (m *midHistory) startProjection(t *testing.T, pool *pgxpool.Pool, hold time.Duration, topics ...string) {
	t.Helper()
	group := fmt.Sprintf("%s-%p", t.Name(), pool)
	factory := func(string) (message.Subscriber, error) {
		return kafkagroup.Subscriber(m.b.addrs, group, watermill.NopLogger{})
	}
	reg := newRegistry(t, pool, 10*time.Second, consumers.Config{Subscribers: factory, Registerer: prometheus.NewRegistry(), HoldTime: hold})
	for _, topic := range topics {
		if err := projection.Register(reg, topic); err != nil {
			t.Fatal(err)
		}
	}
	runRegistry(t, reg, t.Errorf)
}

// TestNewConsumerBootstrapByReplay: a consumer that starts after the topic
// has lost its first records (retention) is fed its history by `posthorn
// replay --topic` to a topic of its own and reads it beside the live one
// (`posthorn consume --bootstrap-topic`): it applies every event once, in
// order, its balances equal the ledger's, and the overlap (the replay
// holds the live events too) is absorbed. Control: the same consumer on
// the live topic alone parks the accounts whose history it never sees.
func TestNewConsumerBootstrapByReplay(t *testing.T) {
	t.Parallel()
	m := startMidHistory(t)
	postTransfers(t, m.ledger, "old", 60, 8)
	m.relayed(t)
	m.forget(t)
	postTransfers(t, m.ledger, "new", 30, 8)
	m.relayed(t)
	total := int64(countEvents(t, m.ledger))

	t.Run("negative control: live topic only", func(t *testing.T) {
		pool := smallConsumerPool(t)
		m.startProjection(t, pool, time.Second, core.TopicEvents)
		wait.ForStatus(t, 30*time.Second, "accounts parked behind their missing history", func() (bool, string) {
			c := counts(t, pool, projection.Name)
			return c.ParkedAggregates > 0, fmt.Sprintf("%+v", c)
		})
		if a := counts(t, pool, projection.Name).Events[core.DispositionApplied]; a >= total {
			t.Fatalf("the live topic alone applied %d of %d events", a, total)
		}
	})

	pool := smallConsumerPool(t)
	const bootstrap = "replay." + projection.Name
	res, err := ops.Replay(context.Background(), ops.ReplayConfig{Ledger: opsstore.New(m.ledger), Sink: newKafkaSink(t, m.b.addrs),
		Spec: ops.ReplaySpec{Topic: bootstrap}})
	if err != nil || res.Sent != total {
		t.Fatalf("replay to %s: %+v, %v (want %d sent)", bootstrap, res, err, total)
	}
	m.startProjection(t, pool, time.Minute, core.TopicEvents, bootstrap)
	wait.ForStatus(t, 60*time.Second, "every event applied", func() (bool, string) {
		c := counts(t, pool, projection.Name)
		return c.Events[core.DispositionApplied] == total, fmt.Sprintf("%+v of %d", c, total)
	})
	if c := counts(t, pool, projection.Name); c.ParkedAggregates != 0 {
		t.Fatalf("parked: %+v", c)
	}
	checkBalances(t, m.ledger, pool)
}

// TestNewConsumerBaselineAtACut: `posthorn consume baseline` starts a new
// balance projection from the ledger's balances at a cut, with its
// positions at the cut's revisions; reading the topic from its start it
// then counts every event up to the cut as a duplicate, applies only the
// later ones, and ends with the ledger's balances. Control: the same
// snapshot without the positions applies the history on top of it again.
func TestNewConsumerBaselineAtACut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := startMidHistory(t)
	postTransfers(t, m.ledger, "before", 40, 6)
	m.relayed(t)
	cut, err := ledgerstore.ReadBalancesAtCut(ctx, m.ledger)
	if err != nil {
		t.Fatal(err)
	}
	before := int64(countEvents(t, m.ledger))
	var atCut int64
	for _, rev := range cut.Revisions {
		atCut += rev
	}
	if atCut != before {
		t.Fatalf("the cut holds %d events, the outbox %d", atCut, before)
	}
	pool := smallConsumerPool(t)
	baseline := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return projection.Baseline(ctx, tx, inboxstore.New(pool), projection.Name, cut)
		})
	}
	if err := baseline(); err != nil {
		t.Fatal(err)
	}
	if err := baseline(); err == nil {
		t.Fatal("a second baseline over the first was accepted")
	}
	control := smallConsumerPool(t)
	for _, b := range cut.Balances { // the snapshot alone, no positions
		if _, err := control.Exec(ctx, `INSERT INTO projection_balances (account, currency, balance, revision) VALUES ($1, $2, $3, $4)`,
			b.Account, b.Currency, b.Balance, cut.Revisions[b.Account]); err != nil {
			t.Fatal(err)
		}
	}
	postTransfers(t, m.ledger, "after", 25, 6)
	m.relayed(t)
	total := int64(countEvents(t, m.ledger))
	m.startProjection(t, pool, time.Minute, core.TopicEvents)
	wait.ForStatus(t, 60*time.Second, "the events after the cut applied", func() (bool, string) {
		c := counts(t, pool, projection.Name)
		seen := c.Events[core.DispositionApplied] + c.Events[core.DispositionDuplicate]
		return seen == total, fmt.Sprintf("%+v of %d", c, total)
	})
	if c := counts(t, pool, projection.Name); c.Events[core.DispositionApplied] != total-before || c.Events[core.DispositionDuplicate] != before {
		t.Fatalf("applied %d and duplicates %d, want %d after the cut and %d at it: %+v",
			c.Events[core.DispositionApplied], c.Events[core.DispositionDuplicate], total-before, before, c)
	}
	checkBalances(t, m.ledger, pool)

	m.startProjection(t, control, time.Minute, core.TopicEvents)
	wait.ForStatus(t, 60*time.Second, "the control applied every event", func() (bool, string) {
		a := counts(t, control, projection.Name).Events[core.DispositionApplied]
		return a == total, fmt.Sprintf("applied %d of %d", a, total)
	})
	proj, err := projection.Balances(ctx, control)
	if err != nil {
		t.Fatal(err)
	}
	doubled := 0
	for _, b := range cut.Balances {
		if b.Balance != 0 && proj[b.Account][b.Currency].Int64() != ledgerBalances(t, m.ledger)[b.Account][b.Currency] {
			doubled++
		}
	}
	if doubled == 0 {
		t.Fatal("control: the snapshot without positions still matched the ledger; the positions were not what kept it right")
	}
}
