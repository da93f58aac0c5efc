package brokers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	phamqp "github.com/posthorn/posthorn/adapters/amqp"
	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/adapters/sqlsink"
	"github.com/posthorn/posthorn/consumers"
)

// natsDurable is a consumer's durable JetStream consumer on a subject;
// durable names may not contain '.'.
func natsDurable(consumer, subject string) string {
	return strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(consumer + "_" + subject)
}

// NATSSubscriber returns a watermill-nats JetStream subscriber for one
// consumer: a durable push consumer per subject (consumer_subject) that
// starts from the stream's first message, explicit acks, one message at a
// time, the unmarshaler matching the sink's marshaler. Subscribe creates
// the topic's stream first if the relay has not.
func NATSSubscriber(cfg phnats.Config, consumer string, opts Options) (message.Subscriber, error) {
	ackWait := 10 * time.Second
	sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
		URL:              cfg.URL,
		NatsOptions:      append(cfg.Options(), nats.Name("posthorn-"+consumer)),
		Unmarshaler:      &wmnats.NATSMarshaler{},
		SubscribersCount: 1,
		AckWaitTimeout:   ackWait,
		CloseTimeout:     10 * time.Second,
		SubjectCalculator: func(_, topic string) *wmnats.SubjectDetail {
			subject := cfg.Subject(topic)
			return &wmnats.SubjectDetail{Primary: subject, QueueGroup: natsDurable(consumer, subject)}
		},
		JetStream: wmnats.JetStreamConfig{
			DurablePrefix:     consumer,
			DurableCalculator: natsDurable,
			SubscribeOptions:  []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.AckWait(ackWait)},
		},
	}, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("nats subscriber %s: %w", consumer, err)
	}
	return &natsEnsuring{Subscriber: sub, cfg: cfg}, nil
}

// natsEnsuring creates a topic's stream before subscribing to it, with the
// sink's stream settings: watermill-nats' own provisioning names a stream
// after the topic, and stream names may not contain '.'.
type natsEnsuring struct {
	*wmnats.Subscriber
	cfg phnats.Config
}

func (s *natsEnsuring) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.ensure(ctx, topic); err != nil {
		return nil, err
	}
	return s.Subscriber.Subscribe(ctx, topic)
}

// SubscribeInitialize creates topic's stream as Subscribe does: the
// embedded subscriber's own would name the stream after the topic, and the
// sink would then refuse that stream as foreign to it and park the topic's
// records.
func (s *natsEnsuring) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.ensure(ctx, topic)
}

func (s *natsEnsuring) ensure(ctx context.Context, topic string) error {
	nc, err := nats.Connect(s.cfg.URL, s.cfg.Options()...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	return phnats.EnsureStream(ctx, js, s.cfg, topic)
}

// AMQPSubscriber returns a watermill-amqp subscriber for one consumer: the
// durable pub/sub topology the sink declares (a fanout exchange per topic,
// the consumer's durable queue bound to it), prefetch 1 so the queue's FIFO
// order is the handling order, and the default reconnect backoff.
func AMQPSubscriber(cfg phamqp.Config, consumer string, opts Options) (message.Subscriber, error) {
	u, err := cfg.DialURL()
	if err != nil {
		return nil, err
	}
	tp := phamqp.Topology{ExchangePrefix: cfg.ExchangePrefix}
	c := wmamqp.NewDurablePubSubConfig(u, func(topic string) string { return tp.Queue(topic, consumer) })
	c.Exchange.GenerateName = tp.Exchange
	ac := cfg.AMQPConfig()
	// ac carries the TLS config; watermill-amqp refuses it set twice
	// (Connection.TLSConfig too), so amqps:// subscribers could not start.
	c.Connection.AmqpConfig = &ac
	sub, err := wmamqp.NewSubscriber(c, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("amqp subscriber %s: %w", consumer, err)
	}
	return sub, nil
}

// RedisSubscriber returns a watermill-redisstream subscriber for one
// consumer: consumer group = the consumer's name, created at the stream's
// first entry, one consumer per process (name consumer@host), and entries
// left pending by a crashed process claimed after 10 s.
func RedisSubscriber(cfg redisstream.Config, consumer string, opts Options) (message.Subscriber, error) {
	host, _ := os.Hostname()
	sub, err := wmredis.NewSubscriber(wmredis.SubscriberConfig{
		Client:        cfg.Client(),
		ConsumerGroup: consumer,
		Consumer:      fmt.Sprintf("%s@%s-%d", consumer, host, os.Getpid()),
		OldestId:      "0",
		ClaimInterval: 2 * time.Second,
		MaxIdleTime:   10 * time.Second,
	}, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("redis subscriber %s: %w", consumer, err)
	}
	return &prefixed{Subscriber: sub, prefix: cfg.StreamPrefix}, nil
}

// prefixed maps a topic to its stream key.
type prefixed struct {
	message.Subscriber
	prefix string
}

func (p *prefixed) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return p.Subscriber.Subscribe(ctx, p.prefix+topic)
}

// PostgresSubscriber returns a watermill-sql subscriber for one consumer on
// the sink's target database: consumer group = the consumer's name, the
// sink's table layout, offsets in watermill-sql's offsets table. Closing
// it closes its pool.
func PostgresSubscriber(cfg sqlsink.Config, consumer string, opts Options) (message.Subscriber, error) {
	pool, err := pgxpool.New(context.Background(), cfg.URL)
	if err != nil {
		return nil, errors.New("postgres subscriber: the URL is not a valid Postgres URL or DSN") // pgx would quote it
	}
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
		ConsumerGroup:    consumer,
		SchemaAdapter:    sqlsink.Schema(),
		OffsetsAdapter:   sqlsink.OffsetsAdapter(),
		InitializeSchema: true,
		PollInterval:     100 * time.Millisecond,
	}, opts.Logger)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres subscriber %s: %w", consumer, err)
	}
	return &poolClosing{Subscriber: sub, pool: pool}, nil
}

type poolClosing struct {
	message.Subscriber
	pool *pgxpool.Pool
}

func (p *poolClosing) Close() error {
	err := p.Subscriber.Close()
	p.pool.Close()
	return err
}

func postgresSubscribers(c Config, opts Options) (consumers.SubscriberFactory, error) {
	if c.Postgres.URL == "" {
		return nil, errors.New("postgres subscribers: no URL")
	}
	return perConsumer(c.Postgres, opts, PostgresSubscriber), nil
}
