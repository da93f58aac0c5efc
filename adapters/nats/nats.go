// Package nats is the NATS JetStream sink. Records are written in
// watermill-nats/v2's format (its NATSMarshaler builds them: the header
// _watermill_message_uuid carries the event ID, every contract header is a
// NATS header), so watermill-nats' JetStream subscriber, and so any consumer
// on a Watermill router, reads them.
//
// Topology: one subject per topic (SubjectPrefix + topic) and one stream per
// subject (its name is the subject with the characters streams may not
// have replaced by '_'), file storage, limits retention, created on first
// use if missing. A stream is FIFO per subject, so per-account order holds.
//
// Delivery: a batch is published asynchronously on one connection (records
// leave in batch order) and Publish returns nil only when every record's
// JetStream PubAck has arrived: the stream has stored it. The event ID is
// also the Nats-Msg-Id, so JetStream itself drops a relay retry that falls
// within the stream's duplicate window (two minutes by default); the inbox
// absorbs the rest. A replay or an operator's resend (Envelope.OperatorRepeat)
// carries no Nats-Msg-Id: JetStream would drop it inside the window and the
// operator would see success while the consumer got nothing.
//
// Errors: a record larger than the server's max_payload, a bad subject, or a
// request JetStream refuses as malformed (API code 400) is permanent;
// everything else (no connection, a timeout, no stream responding) is
// retryable. Once a record of an aggregate has failed, its later records in
// the batch are reported failed too (retryably), so the relay never marks a
// record before its predecessor. The client reconnects by itself and does
// not buffer while disconnected, so an outage fails Publish at once.
package nats

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats.go"

	"github.com/posthorn/posthorn/adapters/internal/sinkgate"
	"github.com/posthorn/posthorn/core"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("nats sink closed")

// Config configures the NATS sink; only URL is required.
type Config struct {
	// URL is the server, e.g. nats://127.0.0.1:4222 (credentials may be in it).
	URL string
	// Username and Password, or Token, authenticate when set.
	Username, Password string
	Token              string
	// TLS, when set, is used for the connection.
	TLS *tls.Config
	// SubjectPrefix is prepended to every topic to form its subject (and so
	// its stream), e.g. "posthorn." or a per-test namespace.
	SubjectPrefix string
	// ConnectTimeout bounds dialling; default 2 s.
	ConnectTimeout time.Duration
	// Name identifies the connection on the server; default posthorn-relay.
	Name string
}

// Options are the nats.go connection options of cfg, shared by the sink and
// the subscribers: authentication, TLS, endless reconnects, and no buffering
// while disconnected (a publish during an outage fails at once instead of
// being held in memory).
func (cfg Config) Options() []nats.Option {
	timeout := cfg.ConnectTimeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	opts := []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.Timeout(timeout),
		nats.RetryOnFailedConnect(true),
	}
	if cfg.Name != "" {
		opts = append(opts, nats.Name(cfg.Name))
	}
	if cfg.Username != "" || cfg.Password != "" {
		opts = append(opts, nats.UserInfo(cfg.Username, cfg.Password))
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.TLS != nil {
		opts = append(opts, nats.Secure(cfg.TLS))
	}
	return opts
}

// Subject is the subject a topic is published on.
func (cfg Config) Subject(topic string) string { return cfg.SubjectPrefix + topic }

// StreamName is the stream holding a topic's subject.
func (cfg Config) StreamName(topic string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '/', '\\':
			return '_'
		}
		return r
	}, cfg.Subject(topic))
}

// maxPending bounds the records awaiting a PubAck; Publish waits for each
// batch's ACKs before the next batch, so this is the largest batch sent
// without stalling.
const maxPending = 1 << 16

// Sink publishes batches to JetStream.
type Sink struct {
	cfg       Config
	nc        *nats.Conn
	js        nats.JetStreamContext
	marshaler wmnats.Marshaler

	streams sync.Map // topic → struct{}: stream known to exist

	gate sinkgate.Gate
}

var _ core.Sink = (*Sink)(nil)

// New connects to the server. A server that is down at start is retried in
// the background (the first Publish then fails retryably) instead of
// failing the relay.
func New(cfg Config) (*Sink, error) {
	if cfg.URL == "" {
		return nil, errors.New("nats sink: no URL")
	}
	if cfg.Name == "" {
		cfg.Name = "posthorn-relay"
	}
	nc, err := nats.Connect(cfg.URL, cfg.Options()...)
	if err != nil {
		return nil, fmt.Errorf("nats sink: connect: %w", err)
	}
	// A whole relay batch is in flight at once. Past the default cap (4,000)
	// nats.go stalls the publisher and fails a publish once a stall lasts
	// 200 ms, which a slow PubAck on a busy server can cause.
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(maxPending))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats sink: jetstream: %w", err)
	}
	return &Sink{cfg: cfg, nc: nc, js: js, marshaler: &wmnats.NATSMarshaler{}, gate: sinkgate.Gate{Closed: ErrClosed}}, nil
}

// EnsureStream creates the stream of topic if it does not exist. The relay
// calls it on first use of a topic; consumers' subscriptions need it too.
func (s *Sink) EnsureStream(ctx context.Context, topic string) error {
	if _, ok := s.streams.Load(topic); ok {
		return nil
	}
	if err := EnsureStream(ctx, s.js, s.cfg, topic); err != nil {
		return err
	}
	s.streams.Store(topic, struct{}{})
	return nil
}

// EnsureStream creates topic's stream on js if it does not exist: file
// storage, limits retention, no size limits, the default duplicate window.
func EnsureStream(ctx context.Context, js nats.JetStreamManager, cfg Config, topic string) error {
	name := cfg.StreamName(topic)
	_, err := js.StreamInfo(name, nats.Context(ctx))
	if err == nil {
		return nil
	}
	if !errors.Is(err, nats.ErrStreamNotFound) {
		return fmt.Errorf("nats sink: stream %s: %w", name, err)
	}
	_, err = js.AddStream(&nats.StreamConfig{
		Name:      name,
		Subjects:  []string{cfg.Subject(topic)},
		Storage:   nats.FileStorage,
		Retention: nats.LimitsPolicy,
		Discard:   nats.DiscardOld,
	}, nats.Context(ctx))
	if err != nil && !errors.Is(err, nats.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("nats sink: create stream %s: %w", name, err)
	}
	return nil
}

// Publish sends the batch and returns nil once JetStream has acknowledged
// every record. If ctx ends first, Publish returns ctx's error; the records
// already sent may or may not be stored (the relay resends them with the
// same event IDs, and the duplicate window drops most repeats).
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	return s.gate.Publish(ctx, batch, s.publish)
}

func (s *Sink) publish(ctx context.Context, batch []core.Envelope) error {
	fails := core.BatchFailures{NotSent: "nats sink: not sent", Sink: "nats sink"}
	futures := make([]nats.PubAckFuture, len(batch))
	for i, e := range batch {
		if fails.Blocked(i, e) {
			continue
		}
		err := s.EnsureStream(ctx, e.Topic)
		var f nats.PubAckFuture
		if err == nil {
			var msg *nats.Msg
			msg, err = s.marshaler.Marshal(s.cfg.Subject(e.Topic), e.ToMessage())
			if err == nil {
				if size := len(msg.Data) + headerSize(msg.Header); size > int(s.nc.MaxPayload()) && s.nc.MaxPayload() > 0 {
					err = fmt.Errorf("%w: record of about %d bytes, server max_payload %d", nats.ErrMaxPayload, size, s.nc.MaxPayload())
				} else {
					var opts []nats.PubOpt
					if !e.OperatorRepeat() {
						// The first publish (and the relay's own retries of it)
						// keep JetStream's dedup; a replay or resend must reach
						// the consumer, so it carries no Nats-Msg-Id.
						opts = append(opts, nats.MsgId(e.EventID))
					}
					f, err = s.js.PublishMsgAsync(msg, opts...)
				}
			}
		}
		if err != nil {
			fails.Fail(i, e, classify(err))
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			fails.Fail(i, batch[i], classify(err))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// A record whose predecessor of the same aggregate failed after sending
	// may be stored, but is not reported ACKed: its marker must not come
	// before its predecessor's.
	fails.HoldBack(batch)
	return fails.Err()
}

func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// classify marks the errors a retry cannot fix as permanent.
func classify(err error) error {
	var apiErr *nats.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrInvalidMsg):
		return core.Permanent(err)
	case errors.As(err, &apiErr) && apiErr.Code == 400:
		return core.Permanent(err)
	}
	return err
}

// Close waits for a Publish in progress and closes the connection; a second
// Close returns nil.
func (s *Sink) Close() error {
	return s.gate.Close(func() error {
		s.nc.Close()
		return nil
	})
}
