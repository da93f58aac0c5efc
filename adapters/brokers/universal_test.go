package brokers_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	phamqp "github.com/posthorn/posthorn/adapters/amqp"
	"github.com/posthorn/posthorn/adapters/brokers"
	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/adapters/sqlsink"
	"github.com/posthorn/posthorn/internal/testkit/amqptest"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/redistest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// universal runs Watermill's universal pub/sub tests on the sink and the
// subscribers brokers opens from cfg, the two ends `posthorn relay` and
// `posthorn consume` open.
func universal(t *testing.T, cfg func(t *testing.T, group string) brokers.Config, features tests.Features, ownGroups bool) {
	if testing.Short() {
		t.Skip("Watermill's universal pub/sub tests take minutes")
	}
	if raceDetector {
		// make test runs them in a step of their own without it:
		// watermill-nats v2.1.3's Subscriber races with itself under the
		// suite's concurrent subscribes (Subscribe against processMessage),
		// and every broker's run takes minutes longer.
		t.Skip("the race detector is on: make test runs Watermill's universal tests without it")
	}
	sinktest.RunUniversal(t, features, ownGroups, func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return universalPubSub(t, cfg, group)
	})
}

// universalPubSub opens cfg's sink, as a Watermill publisher, and the
// subscriber of consumer group (cfg is given the group: a sink that
// declares its consumers' queues must know it).
func universalPubSub(t *testing.T, cfg func(t *testing.T, group string) brokers.Config, group string) (message.Publisher, message.Subscriber) {
	c := cfg(t, group)
	s, err := brokers.OpenSink(c)
	if err != nil {
		t.Fatal(err)
	}
	f, err := brokers.Subscribers(c, brokers.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f(group)
	if err != nil {
		t.Fatal(err)
	}
	return sinktest.NewUniversalPublisher(s), sub
}

// TestUniversalPubSubApacheKafka: the Kafka sink and the consumers' Kafka
// subscriber (kafkagroup) on a real Apache Kafka node. The publisher keeps
// a topic's messages on one partition (one aggregate), so they arrive in
// order.
//
// The subscriber delivers up to kafkagroup.DefaultInFlight messages of a
// partition ahead of their acknowledgements (the inbox behind it orders
// the effects), so Watermill's TestNoAck, which wants the second message
// held back until the first is acknowledged, cannot hold: the suite runs
// without GuaranteedOrder, which skips it, and the order itself is proven
// on its own by TestPublishSubscribeInOrder with GuaranteedOrder.
func TestUniversalPubSubApacheKafka(t *testing.T) {
	k := kafkacluster.Start(t, 1)
	t.Logf("broker: %s", k.Name())
	cfg := func(*testing.T, string) brokers.Config {
		return brokers.Config{Kind: "kafka", Kafka: phkafka.Config{Brokers: k.Brokers}}
	}
	features := tests.Features{ConsumerGroups: true, Persistent: true}
	universal(t, cfg, features, false)
	t.Run("TestPublishSubscribeInOrder with GuaranteedOrder", func(t *testing.T) {
		ordered := features
		ordered.GuaranteedOrder = true
		tests.TestPublishSubscribeInOrder(t, tests.TestContext{TestID: tests.NewTestID(), Features: ordered}, func(t *testing.T) (message.Publisher, message.Subscriber) {
			return universalPubSub(t, cfg, "universal-ordered")
		})
	})
}

// TestUniversalPubSubNATS: the NATS JetStream sink and the consumers'
// JetStream subscriber on the machine's nats-server. Each pub/sub has a
// durable consumer of its own (a new one starts at the stream's first
// message): with the suite's ten subscribers sharing one durable queue
// group, watermill-nats v2.1.3's Close of one of them waits out its close
// timeout and answers "output wait group did not finish"
// (TestConcurrentClose). Several subscribers of one durable divide its
// messages, so order holds with one subscriber.
func TestUniversalPubSubNATS(t *testing.T) {
	url := natstest.SharedURL()
	prefix := natstest.Prefix(t, url)
	universal(t, func(*testing.T, string) brokers.Config {
		return brokers.Config{Kind: "nats", NATS: phnats.Config{URL: url, SubjectPrefix: prefix, ConnectTimeout: 2 * time.Second}}
	}, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: true, GuaranteedOrderWithSingleSubscriber: true, Persistent: true,
		NewSubscriberReceivesOldMessages: true,
		// The long mode's 5,000 messages, acknowledged one at a time by
		// a push consumer, outlast the suite's 15 s reads on a loaded
		// machine now and then (3,773 of 5,000 in one run).
		ForceShort: true,
	}, true)
}

// TestUniversalPubSubRedis: the Redis Streams sink and the consumers'
// consumer-group subscriber on the machine's redis-server.
func TestUniversalPubSubRedis(t *testing.T) {
	addr := redistest.SharedAddr()
	prefix := redistest.Prefix(t, addr)
	universal(t, func(*testing.T, string) brokers.Config {
		return brokers.Config{Kind: "redis", Redis: redisstream.Config{Addr: addr, StreamPrefix: prefix, DialTimeout: time.Second}}
	}, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: true, GuaranteedOrderWithSingleSubscriber: true, Persistent: true,
	}, false)
}

// TestUniversalPubSubPostgres: the PostgreSQL sink and the consumers'
// watermill-sql subscriber on the machine's server, a fresh database for
// each case of the suite. watermill-sql's subscriber reads a row only once
// every transaction older than the row's own has ended (its snapshot's
// xmin), so one database shared by the suite's cases running side by side,
// each holding transactions open while its handlers run, delays every
// other case's delivery past the suite's 15 s: a consumer's target
// database should not serve long transactions of other work. The suite
// runs in its short mode here: its long mode took 302 s and passed.
func TestUniversalPubSubPostgres(t *testing.T) {
	var mu sync.Mutex
	dbs := map[string]string{} // the suite's case → its database
	universal(t, func(t *testing.T, _ string) brokers.Config {
		c := strings.Join(strings.SplitN(t.Name(), "/", 3)[:2], "/")
		mu.Lock()
		defer mu.Unlock()
		if dbs[c] == "" {
			dbs[c] = pgtest.NewDatabase(t)
		}
		return brokers.Config{Kind: "postgres", Postgres: sqlsink.Config{URL: dbs[c]}}
	}, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: true, Persistent: true,
		// The long mode's thousands of messages a case take five minutes
		// through a subscriber that reads a row a transaction every 100 ms.
		ForceShort: true,
	}, false)
}

// TestUniversalPubSubRabbitMQ: the AMQP sink and the consumers' durable
// queue subscriber on the machine's RabbitMQ. The sink declares and binds
// the queues of the consumers it is configured with (sink.amqp.consumers),
// here the pub/sub's group, so what is published before the group's first
// subscriber starts waits in its queue.
func TestUniversalPubSubRabbitMQ(t *testing.T) {
	url := amqptest.SharedURL()
	prefix := amqptest.Prefix(t, url, nil, nil)
	universal(t, func(_ *testing.T, group string) brokers.Config {
		return brokers.Config{Kind: "amqp", AMQP: phamqp.Config{URL: url, ExchangePrefix: prefix, Consumers: []string{group}}}
	}, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: true, GuaranteedOrderWithSingleSubscriber: true, Persistent: true,
	}, false)
}
