// Package redisstream is the Redis Streams sink. Records are written in
// watermill-redisstream's format (its DefaultMarshallerUnmarshaller builds
// the entry: field _watermill_message_uuid carries the event ID, metadata
// holds every contract header, payload the payload), so
// watermill-redisstream's subscriber, and so any consumer on a Watermill
// router, reads them.
//
// Topology: one stream per topic (key StreamPrefix + topic), never trimmed
// (no MAXLEN: trimming would drop what a consumer has not read); one
// consumer group per consumer, created by the subscriber from the first
// entry. A stream is FIFO, so per-account order holds.
//
// Delivery: a batch is sent as one pipeline of XADD commands (sent in
// batch order) and Publish returns nil only when every XADD has returned
// its entry ID: Redis has appended the entry. That is durable only as far
// as the server's persistence makes it: with appendonly yes and appendfsync
// always the reply comes after the AOF is fsynced; with the defaults
// (everysec, or no AOF at all) a server crash loses the last second, or
// everything. Redis has no idempotent XADD: resends are absorbed by the
// consumers' inbox.
//
// Errors: a record over MaxPayloadBytes (Redis's proto-max-bulk-len) and a
// WRONGTYPE reply (the key holds another type) are permanent; everything
// else (connection loss, OOM, LOADING, timeouts) is retryable. Once a
// record of an aggregate has failed, its later records in the batch are
// reported failed too. The client reconnects by itself.
package redisstream

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"time"

	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"

	"github.com/posthorn/posthorn/adapters/internal/sinkgate"
	"github.com/posthorn/posthorn/core"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("redis sink closed")

// MaxPayloadBytesDefault is Redis's default proto-max-bulk-len (512 MiB).
const MaxPayloadBytesDefault = 512 << 20

// Config configures the Redis Streams sink; only Addr is required.
type Config struct {
	// Addr is host:port.
	Addr string
	// Username (Redis 6 ACL) and Password authenticate when set.
	Username, Password string
	// DB is the database number.
	DB int
	// TLS, when set, is used for the connection.
	TLS *tls.Config
	// StreamPrefix is prepended to every topic to form its stream key.
	StreamPrefix string
	// MaxPayloadBytes rejects larger payloads permanently; default
	// MaxPayloadBytesDefault.
	MaxPayloadBytes int
	// DialTimeout bounds dialling; default 2 s.
	DialTimeout time.Duration
}

// Stream is the stream key of topic.
func (cfg Config) Stream(topic string) string { return cfg.StreamPrefix + topic }

// Client returns a go-redis client for cfg, shared by the sink and the
// subscribers.
func (cfg Config) Client() *redis.Client {
	timeout := cfg.DialTimeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	return redis.NewClient(&redis.Options{
		Addr:        cfg.Addr,
		Username:    cfg.Username,
		Password:    cfg.Password,
		DB:          cfg.DB,
		TLSConfig:   cfg.TLS,
		DialTimeout: timeout,
		ClientName:  "posthorn",
		// Pipelines of a whole batch: no command-level retries that could
		// reorder entries; the relay retries the batch.
		MaxRetries: -1,
	})
}

// Sink publishes batches to Redis Streams.
type Sink struct {
	cfg       Config
	client    *redis.Client
	marshaler wmredis.DefaultMarshallerUnmarshaller

	gate sinkgate.Gate
}

var _ core.Sink = (*Sink)(nil)

// New returns a sink; the client connects on first use.
func New(cfg Config) (*Sink, error) {
	if cfg.Addr == "" {
		return nil, errors.New("redis sink: no addr")
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = MaxPayloadBytesDefault
	}
	return &Sink{cfg: cfg, client: cfg.Client(), gate: sinkgate.Gate{Closed: ErrClosed}}, nil
}

// Publish appends the batch and returns nil once every XADD has replied.
// If ctx ends first, Publish returns ctx's error; entries already sent may
// or may not be appended (the relay resends them with the same event IDs).
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	return s.gate.Publish(ctx, batch, s.publish)
}

func (s *Sink) publish(ctx context.Context, batch []core.Envelope) error {
	fails := core.BatchFailures{NotSent: "redis sink: not sent", Sink: "redis sink"}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(batch))
	for i, e := range batch {
		if !sinkgate.Admit(&fails, i, e, "redis sink", s.cfg.MaxPayloadBytes) {
			continue
		}
		values, err := s.marshaler.Marshal(e.Topic, e.ToMessage())
		if err != nil {
			fails.Fail(i, e, core.Permanent(err))
			continue
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: s.cfg.Stream(e.Topic), Values: values})
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	for i, e := range batch {
		if cmds[i] != nil {
			if err := cmds[i].Err(); err != nil {
				fails.Fail(i, e, classify(err))
			}
		}
	}
	// Not reported ACKed after a failed predecessor of its aggregate.
	fails.HoldBack(batch)
	return fails.Err()
}

// classify marks the errors a retry cannot fix as permanent.
func classify(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE") {
		return core.Permanent(err)
	}
	return err
}

// Close waits for a Publish in progress and closes the client; a second
// Close returns nil.
func (s *Sink) Close() error { return s.gate.Close(s.client.Close) }
