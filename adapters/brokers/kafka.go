package brokers

import (
	"errors"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/consumers"
)

// KafkaSaramaConfig is the sarama configuration of the Kafka subscribers:
// Watermill's default with the initial offset set to the oldest record,
// because Watermill's default (newest) makes a consumer group that joins
// late miss everything published before it (field-notes.md).
func KafkaSaramaConfig() *sarama.Config {
	c := wmkafka.DefaultSaramaSubscriberConfig()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	// A JoinGroup may block for the whole rebalance timeout while the
	// coordinator waits for a member that died (SIGKILL), but sarama
	// bounds it by Net.ReadTimeout (30 s): with the default 60 s timeout
	// the survivors time out, rejoin and wait again, and the group stalls
	// for minutes (seen in the fault suite over kfake). Keep the rebalance
	// timeout well under the read timeout.
	c.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	// A SIGKILLed member holds its partitions until its session times out;
	// after a consumer kill that wait is most of the time to recovery.
	// 6 s is the broker's floor (group.min.session.timeout.ms, kfake's too;
	// sarama's default is 10 s), with a heartbeat every 2 s.
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Heartbeat.Interval = 2 * time.Second
	return c
}

// KafkaSubscriber returns the Kafka subscriber of one consumer: a sarama
// consumer-group member (group = the consumer's name, oldest offset first)
// that delivers up to DefaultInFlight messages per partition ahead of their
// acknowledgements and commits only acknowledged prefixes (member), reads
// watermill-kafka's DefaultMarshaler the relay's Kafka sink writes with
// (message UUID = event ID, metadata = the wire headers), and re-joins its
// group when a partition stops being delivered (groupSubscriber, after
// DefaultStallAfter).
// sec, when given, sets the connections' TLS and SASL (phkafka.Security).
func KafkaSubscriber(brokers []string, consumer string, logger watermill.LoggerAdapter, sec ...phkafka.Security) (message.Subscriber, error) {
	return kafkaGroupSubscriber(brokers, consumer, Options{Logger: logger}, nil, false, sec...)
}

// KafkaReadCommittedSubscriber is KafkaSubscriber reading with
// read_committed: what a router without Posthorn's inbox needs on a topic
// written in exactly-once mode. A read_uncommitted reader of such a topic
// also receives the records of aborted transactions, which are sent again
// in a later one: the inbox absorbs them as duplicates, other handlers see
// repeats.
func KafkaReadCommittedSubscriber(brokers []string, consumer string, logger watermill.LoggerAdapter, sec ...phkafka.Security) (message.Subscriber, error) {
	return kafkaGroupSubscriber(brokers, consumer, Options{Logger: logger}, nil, true, sec...)
}

// staticVersion is the protocol version static membership needs: JoinGroup
// v5 carries the instance ID. Not higher: at 2.4 sarama's requests (the
// flexible JoinGroup v6 and others) fail to decode against kfake.
var staticVersion = sarama.V2_3_0_0

// kafkaGroupSubscriber reads opts' Logger, StallAfter, InstanceID and
// Fenced.
func kafkaGroupSubscriber(brokers []string, consumer string, opts Options, rejoins prometheus.Counter, readCommitted bool, sec ...phkafka.Security) (*groupSubscriber, error) {
	if len(brokers) == 0 {
		return nil, errors.New("kafka subscriber of " + consumer + ": no brokers")
	}
	sc := KafkaSaramaConfig()
	if readCommitted {
		sc.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	for _, s := range sec {
		if err := s.Apply(sc); err != nil {
			return nil, err
		}
	}
	if opts.InstanceID != "" && !sc.Version.IsAtLeast(staticVersion) {
		sc.Version = staticVersion
	}
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = watermill.NopLogger{}
	}
	return newGroupSubscriber(brokers, consumer, sc, opts, rejoins), nil
}

// kafkaSubscribers gives each consumer a group subscriber of its own on
// c.Kafka's brokers, with its TLS and SASL; with a Registerer, its re-joins
// are counted and its offset lag measured. They read read_uncommitted also
// when the relay writes in exactly-once mode: behind the inbox an aborted
// copy is a duplicate like any other (its event is committed in the ledger,
// and the committed copy follows with the same event ID), and they need not
// wait for the stable offset.
func kafkaSubscribers(c Config, opts Options) (consumers.SubscriberFactory, error) {
	if len(c.Kafka.Brokers) == 0 {
		return nil, errors.New("kafka subscribers: no brokers")
	}
	brokers, sec := slices.Clone(c.Kafka.Brokers), c.Kafka.Security
	return func(consumer string) (message.Subscriber, error) {
		var rejoins prometheus.Counter
		if opts.Registerer != nil {
			vec, err := rejoinCounter(opts.Registerer)
			if err != nil {
				return nil, err
			}
			rejoins = vec.WithLabelValues(consumer)
		}
		sub, err := kafkaGroupSubscriber(brokers, consumer, opts, rejoins, false, sec)
		if err != nil || opts.Registerer == nil {
			return sub, err
		}
		return newLagSubscriber(sub, consumer, opts.Registerer, opts.LagInterval)
	}, nil
}
