package consumers

import (
	"context"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/core"
)

// SubscriberFactory returns the subscriber a consumer reads with. It is
// called once per registered handler with the consumer's name, so brokers
// with consumer groups (Kafka) give each consumer its own group. The
// registry owns what it returns and closes it when Run ends.
type SubscriberFactory func(consumer string) (message.Subscriber, error)

// Defaults of Config.
const (
	DefaultHoldTime        = 30 * time.Second
	DefaultMaxRetries      = 5
	DefaultInitialInterval = 50 * time.Millisecond
	DefaultMaxInterval     = 2 * time.Second
	DefaultMaxBatch        = 512
)

// TxBeginner starts a transaction on the consumers' database; a
// *pgxpool.Pool is one.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures a Registry.
type Config struct {
	// Pool is the consumers' own database (a *pgxpool.Pool migrated with
	// adapters/postgres.ConsumerSchema): WithoutInbox handlers run in plain
	// transactions on it. Required.
	Pool TxBeginner
	// Inbox is the store on Pool that records every delivery
	// (adapters/postgres/inboxstore.New). Required.
	Inbox Inbox
	// Subscribers gives each consumer its subscriber. Required unless every
	// handler is registered WithSubscriber.
	Subscribers SubscriberFactory
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger for parks, rejections, poison and retries; nil discards.
	Logger *slog.Logger
	// HoldTime is how long an event received ahead of its predecessor is
	// held before its aggregate is parked (default DefaultHoldTime).
	HoldTime time.Duration
	// SweepInterval is how often each consumer re-drives held events and
	// parks expired holds (default HoldTime/10, within 10ms..1s).
	SweepInterval time.Duration
	// Retry configures the retries of a failing handler; zero fields take
	// the Default… values. Its ShouldRetry and OnRetryHook are not used:
	// permanent errors are never retried (they park). The waits are
	// InitialInterval, then times Multiplier up to MaxInterval.
	Retry middleware.Retry
	// CommandTopicPrefix is the prefix of command topics (default
	// core.CommandTopicPrefix).
	CommandTopicPrefix string
	// MaxBatch bounds how many deliveries the inbox applies in one
	// transaction (default DefaultMaxBatch); 1 gives every delivery a
	// transaction of its own, as before batching (the benchmark's
	// baseline).
	MaxBatch int
	// TracerProvider, when set, gives every delivery an apply span that
	// continues the record's traceparent (trace.go); nil is tracing off.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HoldTime <= 0 {
		c.HoldTime = DefaultHoldTime
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = min(max(c.HoldTime/10, 10*time.Millisecond), time.Second)
	}
	if c.Retry.MaxRetries == 0 {
		c.Retry.MaxRetries = DefaultMaxRetries
	}
	if c.Retry.InitialInterval == 0 {
		c.Retry.InitialInterval = DefaultInitialInterval
	}
	if c.Retry.MaxInterval == 0 {
		c.Retry.MaxInterval = DefaultMaxInterval
	}
	if c.Retry.Multiplier == 0 {
		c.Retry.Multiplier = 2
	}
	if c.CommandTopicPrefix == "" {
		c.CommandTopicPrefix = core.CommandTopicPrefix
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = DefaultMaxBatch
	}
}
