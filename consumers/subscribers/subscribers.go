// Package subscribers builds the Watermill subscriber each consumer reads
// with from the sink configuration (sink.kind), so `posthorn consume` reads
// from whatever the relay publishes to.
//
// Adding a broker is one line in kinds plus its constructor. Each
// constructor returns a consumers.SubscriberFactory: it is called once per
// consumer name, and brokers with consumer groups give every consumer its
// own group, so each consumer sees every event.
package subscribers

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers"
)

// Options are what a constructor may need beyond the configuration.
type Options struct {
	// Logger is Watermill's; nil discards.
	Logger watermill.LoggerAdapter
	// Registerer, when set, receives posthorn_consumer_offset_lag for
	// brokers whose subscriber exposes offsets (Kafka).
	Registerer prometheus.Registerer
	// LagInterval is how often the lag is measured (DefaultLagInterval).
	LagInterval time.Duration
	// StallAfter is how long a Kafka partition may stay behind with no
	// commit before the consumer re-joins its group (DefaultStallAfter).
	StallAfter time.Duration
	// Memory is the in-process subscriber of sink.kind memory (the memory
	// sink's Subscriber). The memory broker lives in one process, so it is
	// only usable when the relay runs in the same process (posthorn demo,
	// tests).
	Memory message.Subscriber
}

type constructor func(configs.Sink, Options) (consumers.SubscriberFactory, error)

// kinds maps sink.kind to its subscriber constructor.
var kinds = map[string]constructor{
	"kafka":    kafkaSubscribers,
	"memory":   memorySubscribers,
	"nats":     natsSubscribers,
	"amqp":     amqpSubscribers,
	"redis":    redisSubscribers,
	"postgres": postgresSubscribers,
}

// ErrUnknownKind is returned for a sink.kind without a subscriber.
var ErrUnknownKind = errors.New("no subscriber for this sink kind")

// New returns the factory for sink.Kind.
func New(sink configs.Sink, opts Options) (consumers.SubscriberFactory, error) {
	if opts.Logger == nil {
		opts.Logger = watermill.NopLogger{}
	}
	c, ok := kinds[sink.Kind]
	if !ok {
		return nil, fmt.Errorf("sink.kind %q: %w (have %v)", sink.Kind, ErrUnknownKind, Kinds())
	}
	return c(sink, opts)
}

// Kinds lists the sink kinds consumers can read from.
func Kinds() []string {
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// KafkaSaramaConfig is the sarama configuration of the Kafka subscribers:
// Watermill's default with the initial offset set to the oldest record,
// because Watermill's default (newest) makes a consumer group that joins
// late miss everything published before it (field-notes.md).
func KafkaSaramaConfig() *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
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
// sec, when given, sets the connections' TLS and SASL (KafkaSecurity).
func KafkaSubscriber(brokers []string, consumer string, logger watermill.LoggerAdapter, sec ...phkafka.Security) (message.Subscriber, error) {
	return kafkaGroupSubscriber(brokers, consumer, logger, DefaultStallAfter, nil, sec...)
}

func kafkaGroupSubscriber(brokers []string, consumer string, logger watermill.LoggerAdapter, stallAfter time.Duration, rejoins prometheus.Counter, sec ...phkafka.Security) (*groupSubscriber, error) {
	if len(brokers) == 0 {
		return nil, errors.New("kafka subscriber of " + consumer + ": no brokers")
	}
	sc := KafkaSaramaConfig()
	for _, s := range sec {
		if err := s.Apply(sc); err != nil {
			return nil, err
		}
	}
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return newGroupSubscriber(brokers, consumer, sc, logger, stallAfter, rejoins), nil
}

// KafkaSecurity is the TLS and SASL of sink.kafka.{tls,sasl}, for the
// relay's sink and the consumers' subscribers alike.
func KafkaSecurity(s configs.Sink) (phkafka.Security, error) {
	t, err := s.Kafka.TLS.Load("sink.kafka.tls")
	if err != nil {
		return phkafka.Security{}, err
	}
	return phkafka.Security{TLS: t, SASLMechanism: s.Kafka.SASL.Mechanism,
		SASLUser: s.Kafka.SASL.Username, SASLPassword: s.Kafka.SASL.Password}, nil
}

func kafkaSubscribers(sink configs.Sink, opts Options) (consumers.SubscriberFactory, error) {
	if len(sink.Kafka.Brokers) == 0 {
		return nil, errors.New("sink.kafka.brokers is required when sink.kind is kafka")
	}
	brokers := append([]string(nil), sink.Kafka.Brokers...)
	sec, err := KafkaSecurity(sink)
	if err != nil {
		return nil, err
	}
	return func(consumer string) (message.Subscriber, error) {
		var rejoins prometheus.Counter
		if opts.Registerer != nil {
			rejoins = rejoinCounter(opts.Registerer).WithLabelValues(consumer)
		}
		sub, err := kafkaGroupSubscriber(brokers, consumer, opts.Logger, opts.StallAfter, rejoins, sec)
		if err != nil || opts.Registerer == nil {
			return sub, err
		}
		return newLagSubscriber(sub, consumer, opts.Registerer, opts.LagInterval)
	}, nil
}

func memorySubscribers(_ configs.Sink, opts Options) (consumers.SubscriberFactory, error) {
	if opts.Memory == nil {
		return nil, errors.New("sink.kind memory is in-process only: run the relay and the consumers in one process (posthorn demo), or use kafka")
	}
	sub := opts.Memory
	return func(string) (message.Subscriber, error) { return sub, nil }, nil
}
