package brokers_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/posthorn/posthorn/adapters/brokers"
	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkacluster"
	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/adapters/nats/natstest"
	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/adapters/redisstream/redistest"
	"github.com/posthorn/posthorn/adapters/sinktest"
)

// universal runs Watermill's universal pub/sub tests on the sink and the
// subscribers brokers opens from cfg, the two ends `posthorn relay` and
// `posthorn consume` open.
func universal(t *testing.T, cfg func(t *testing.T) brokers.Config, features tests.Features) {
	if testing.Short() {
		t.Skip("Watermill's universal pub/sub tests take minutes")
	}
	sinktest.RunUniversal(t, features, func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return universalPubSub(t, cfg, group)
	})
}

// universalPubSub opens cfg's sink, as a Watermill publisher, and the
// subscriber of consumer group.
func universalPubSub(t *testing.T, cfg func(t *testing.T) brokers.Config, group string) (message.Publisher, message.Subscriber) {
	s, err := brokers.OpenSink(cfg(t))
	if err != nil {
		t.Fatal(err)
	}
	f, err := brokers.Subscribers(cfg(t), brokers.Options{})
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
// subscriber (kafkagroup) on a real Apache Kafka node. Each pub/sub is a
// consumer group of its own that starts at the oldest record, so a new
// subscriber receives the old messages; the publisher keeps a topic's
// messages on one partition (one aggregate), so they arrive in order.
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
	cfg := func(*testing.T) brokers.Config {
		return brokers.Config{Kind: "kafka", Kafka: phkafka.Config{Brokers: k.Brokers}}
	}
	features := tests.Features{ConsumerGroups: true, Persistent: true, NewSubscriberReceivesOldMessages: true}
	universal(t, cfg, features)
	t.Run("TestPublishSubscribeInOrder with GuaranteedOrder", func(t *testing.T) {
		ordered := features
		ordered.GuaranteedOrder = true
		tests.TestPublishSubscribeInOrder(t, tests.TestContext{TestID: tests.NewTestID(), Features: ordered}, func(t *testing.T) (message.Publisher, message.Subscriber) {
			return universalPubSub(t, cfg, "universal-"+watermill.NewShortUUID())
		})
	})
}

// TestUniversalPubSubNATS: the NATS JetStream sink and the consumers'
// JetStream subscriber on the machine's nats-server.
func TestUniversalPubSubNATS(t *testing.T) {
	url := natstest.SharedURL()
	prefix := natstest.Prefix(t, url)
	universal(t, func(*testing.T) brokers.Config {
		return brokers.Config{Kind: "nats", NATS: phnats.Config{URL: url, SubjectPrefix: prefix, ConnectTimeout: 2 * time.Second}}
	}, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: true, Persistent: true,
		NewSubscriberReceivesOldMessages: true,
	})
}

// TestUniversalPubSubRedis: the Redis Streams sink and the consumers'
// consumer-group subscriber on the machine's redis-server.
func TestUniversalPubSubRedis(t *testing.T) {
	addr := redistest.SharedAddr()
	prefix := redistest.Prefix(t, addr)
	universal(t, func(*testing.T) brokers.Config {
		return brokers.Config{Kind: "redis", Redis: redisstream.Config{Addr: addr, StreamPrefix: prefix, DialTimeout: time.Second}}
	}, tests.Features{
		ConsumerGroups: true, GuaranteedOrder: true, Persistent: true,
		NewSubscriberReceivesOldMessages: true,
	})
}
