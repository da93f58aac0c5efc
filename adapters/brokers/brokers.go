// Package brokers is the one place that opens brokers: it turns one sink's
// plain settings (Config: the kind and each adapter's own Config) into the
// relay's core.Sink (OpenSink) or the consumers' Watermill subscribers
// (Subscribers), for every sink kind (Kinds). Both ends are built from the
// same Config, so the relay and the consumers can never disagree on a
// topic's subject, exchange, queue, stream or table name.
//
// Subscribers returns a consumers.SubscriberFactory: it is called once per
// consumer name, and brokers with consumer groups give every consumer its
// own group, so each consumer sees every event. Adding a kind is one entry
// in kinds, its sink and its subscribers (and, to configure it, its keys in
// configs and their mapping in cmd/posthorn).
//
// The package takes plain structs and reads no configuration: cmd/posthorn
// maps its sink.* keys onto Config (and names the key in errors), tests
// build Config directly. Errors name the broker; those of the sinks and of
// the subscribers' settings never quote a URL, which may hold a password.
//
// No kind is built through adapters/watermillsink: Kafka's and memory's
// sinks are no Watermill publishers, and the others promise more than one
// can (per-record ACKs and failures, NATS' Nats-Msg-Id dedup, RabbitMQ's
// returns of unroutable records, Postgres' one transaction per batch), so
// watermillsink stays the library adapter for a Watermill publisher a
// program brings itself.
package brokers

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	phamqp "github.com/posthorn/posthorn/adapters/amqp"
	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/memory"
	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/adapters/sqlsink"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// Config is one sink's settings: Kind picks the kind, and only that kind's
// field is read.
type Config struct {
	// Kind is one of Kinds.
	Kind     string
	Kafka    phkafka.Config
	Memory   memory.Config
	NATS     phnats.Config
	AMQP     phamqp.Config
	Redis    redisstream.Config
	Postgres sqlsink.Config
}

// Options are what the subscribers need beyond Config.
type Options struct {
	// Logger is Watermill's, for every kind; nil discards.
	Logger watermill.LoggerAdapter
	// Kafka is what the Kafka subscribers take besides (kafkagroup.Options
	// says what each field does); its Logger is Logger.
	Kafka kafkagroup.Options
	// Memory is the in-process subscriber of kind memory (the memory
	// sink's Subscriber). The memory broker lives in one process, so it is
	// only usable when the relay runs in the same process (posthorn demo,
	// tests).
	Memory message.Subscriber
}

// kind is how one sink kind opens its two ends.
type kind struct {
	sink        func(Config) (core.Sink, error)
	subscribers func(Config, Options) (consumers.SubscriberFactory, error)
}

// kinds maps Config.Kind to its sink and subscribers.
var kinds = map[string]kind{
	"kafka": {
		sink: func(c Config) (core.Sink, error) {
			if c.Kafka.ExactlyOnce {
				return asSink(phkafka.NewExactlyOnce(c.Kafka))
			}
			return asSink(phkafka.New(c.Kafka))
		},
		subscribers: func(c Config, o Options) (consumers.SubscriberFactory, error) {
			k := o.Kafka
			k.Logger = o.Logger
			return kafkagroup.Factory(c.Kafka.Brokers, c.Kafka.Security, k)
		},
	},
	// An in-process broker: useful in the demo and tests, where consumers
	// share the process; a standalone relay with it only drains the outbox.
	"memory": {
		sink:        func(c Config) (core.Sink, error) { return memory.New(c.Memory), nil },
		subscribers: memorySubscribers,
	},
	"nats":  broker(func(c Config) phnats.Config { return c.NATS }, phnats.New, NATSSubscriber),
	"amqp":  broker(func(c Config) phamqp.Config { return c.AMQP }, phamqp.New, AMQPSubscriber),
	"redis": broker(func(c Config) redisstream.Config { return c.Redis }, redisstream.New, RedisSubscriber),
	"postgres": {
		sink:        func(c Config) (core.Sink, error) { return asSink(sqlsink.New(c.Postgres)) },
		subscribers: postgresSubscribers,
	},
}

// ErrUnknownKind is returned for a Config.Kind not in Kinds.
var ErrUnknownKind = errors.New("no sink or subscribers for this kind")

func lookup(name string) (kind, error) {
	k, ok := kinds[name]
	if !ok {
		return kind{}, fmt.Errorf("sink kind %q: %w (have %v)", name, ErrUnknownKind, Kinds())
	}
	return k, nil
}

// OpenSink returns the relay's sink of c.Kind.
func OpenSink(c Config) (core.Sink, error) {
	k, err := lookup(c.Kind)
	if err != nil {
		return nil, err
	}
	return k.sink(c)
}

// Subscribers returns the consumers' subscriber factory of c.Kind.
// Settings a subscriber cannot start without are checked here, before any
// consumer asks for one.
func Subscribers(c Config, opts Options) (consumers.SubscriberFactory, error) {
	k, err := lookup(c.Kind)
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = watermill.NopLogger{}
	}
	return k.subscribers(c, opts)
}

// Kinds lists the sink kinds, sorted.
func Kinds() []string { return slices.Sorted(maps.Keys(kinds)) }

// asSink returns s as a core.Sink, and a nil interface (not a nil *S) with
// an error.
func asSink[S core.Sink](s S, err error) (core.Sink, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}

// broker is the kind of a broker whose sink and subscribers are built from
// its own settings (settings picks them from Config) and nothing else.
func broker[C any, S core.Sink](settings func(Config) C, sink func(C) (S, error),
	subscriber func(C, string, Options) (message.Subscriber, error)) kind {
	return kind{
		sink: func(c Config) (core.Sink, error) { return asSink(sink(settings(c))) },
		subscribers: func(c Config, o Options) (consumers.SubscriberFactory, error) {
			return perConsumer(settings(c), o, subscriber), nil
		},
	}
}

// perConsumer is the factory of a kind whose subscriber needs nothing but
// its settings and the consumer's name.
func perConsumer[C any](cfg C, opts Options, subscriber func(C, string, Options) (message.Subscriber, error)) consumers.SubscriberFactory {
	return func(consumer string) (message.Subscriber, error) { return subscriber(cfg, consumer, opts) }
}

func memorySubscribers(_ Config, opts Options) (consumers.SubscriberFactory, error) {
	if opts.Memory == nil {
		return nil, errors.New("sink kind memory is in-process only: run the relay and the consumers in one process (posthorn demo), or use kafka")
	}
	sub := opts.Memory
	return func(string) (message.Subscriber, error) { return sub, nil }, nil
}
