// Package nats is the NATS JetStream sink. Records are written in
// watermill-nats/v2's format (its NATSMarshaler builds them: the header
// _watermill_message_uuid carries the event ID, every contract header is a
// NATS header), so watermill-nats' JetStream subscriber, and so any consumer
// on a Watermill router, reads them.
//
// Topology: one subject per topic (SubjectPrefix + topic) and one stream per
// subject, file storage, limits retention, created on first use if missing.
// A stream is FIFO per subject, so per-account order holds. Stream names are
// one-to-one with topics (StreamName): a plain topic's stream is its subject
// with '.' replaced by '_' (ledger.events → ledger_events, the name earlier
// versions gave it); a topic holding '_', '~', '/', '\' or a control
// character, or one too long for a stream name, gets a readable part, '~'
// and 128 bits of the topic's SHA-256, so wallet.x and wallet_x never share
// a stream. A topic that is not a plain NATS subject (empty tokens,
// whitespace, the wildcards '*' and '>') is refused for good: as a stream's
// subject a wildcard would capture other topics' records.
//
// An existing stream of a topic's name is used only if one of its subjects
// matches the topic's subject; otherwise, or when another stream already
// captures the subject, the topic is refused for good with an error naming
// the stream, so its aggregates park instead of every publish failing with
// "no responders" while the shard stalls.
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
// Errors: a record larger than the server's max_payload, a bad subject, a
// topic whose stream is not its own (above), or a request JetStream refuses
// as malformed (API code 400) is permanent; everything else (no connection,
// a timeout, no stream responding) is retryable. After "no responders" the
// stream is looked up again before the next publish on its topic, so a
// stream deleted or replaced meanwhile is recreated or refused rather than
// retried forever. Once a record of an aggregate has failed, its later records in
// the batch are reported failed too (retryably), so the relay never marks a
// record before its predecessor. The client reconnects by itself and does
// not buffer while disconnected, so an outage fails Publish at once.
package nats

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

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

// maxStreamName bounds a stream name: the server keeps each stream in a
// directory of that name, and file systems cap a name at 255 bytes.
const maxStreamName = 255

// StreamName is the stream holding a topic's subject, one-to-one with the
// topic for a given SubjectPrefix: the prefix with its '.' replaced by '_',
// then, for a plain topic (plainStreamTopic), the topic with '.' replaced by
// '_', or else a readable part of the topic, '~' and 32 hex digits of the
// topic's SHA-256. Plain topics contain no '_' or '~', so the first form is
// reversible and never has a '~' after the prefix, as the second always
// does.
func (cfg Config) StreamName(topic string) string {
	prefix := legacyStreamName(cfg.SubjectPrefix)
	if plainStreamTopic(topic) && len(prefix)+len(topic) <= maxStreamName {
		return prefix + strings.ReplaceAll(topic, ".", "_")
	}
	sum := sha256.Sum256([]byte(topic))
	readable := []byte(topic[:min(len(topic), 64)])
	for i, b := range readable {
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-') {
			readable[i] = '_'
		}
	}
	return prefix + string(readable) + "~" + hex.EncodeToString(sum[:16])
}

// legacyStreamName is the name earlier versions derived from a subject:
// the characters streams may not hold replaced by '_'.
func legacyStreamName(subject string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '/', '\\':
			return '_'
		}
		return r
	}, subject)
}

// plainStreamTopic reports whether topic keeps the stream name earlier
// versions gave it: no byte that name replaced or could be confused with
// ('_', '~', '/', '\\', '*', '>'), no space or control character.
func plainStreamTopic(topic string) bool {
	if topic == "" {
		return false
	}
	for i := 0; i < len(topic); i++ {
		switch b := topic[i]; {
		case b <= ' ' || b == 0x7f:
			return false
		case strings.IndexByte("_~/\\*>", b) >= 0:
			return false
		}
	}
	return true
}

// ErrNotSubject is the permanent error of a topic that is not a plain
// NATS subject.
var ErrNotSubject = errors.New("topic is not a plain NATS subject")

// checkSubject refuses a subject with an empty token, whitespace or a
// control character, or a wildcard ('*', '>'): published on, it could not
// be stored; as a stream's subject, it would capture other topics.
func checkSubject(topic, subject string) error {
	for _, tok := range strings.Split(subject, ".") {
		if tok == "" {
			return core.Permanent(fmt.Errorf("nats sink: topic %.120q (subject %.120q): %w: empty token", topic, subject, ErrNotSubject))
		}
	}
	if i := strings.IndexFunc(subject, func(r rune) bool { return r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return core.Permanent(fmt.Errorf("nats sink: topic %.120q (subject %.120q): %w: %q at byte %d", topic, subject, ErrNotSubject, subject[i:i+1], i))
	}
	return nil
}

// ErrForeignStream is the permanent error of a topic whose stream name is
// taken by a stream not capturing its subject, or whose subject another
// stream captures.
var ErrForeignStream = errors.New("the topic's stream is not its own")

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
// A stream of that name that captures other subjects, a subject another
// stream already captures, or a topic that is no plain subject is a
// permanent error naming the stream (ErrForeignStream, ErrNotSubject).
func EnsureStream(ctx context.Context, js nats.JetStreamManager, cfg Config, topic string) error {
	name, subject := cfg.StreamName(topic), cfg.Subject(topic)
	if err := checkSubject(topic, subject); err != nil {
		return err
	}
	info, err := js.StreamInfo(name, nats.Context(ctx))
	if err == nil {
		for _, pattern := range info.Config.Subjects {
			if subjectMatches(pattern, subject) {
				return nil
			}
		}
		return core.Permanent(fmt.Errorf("nats sink: stream %s exists but captures %q, not %s: %w; it was made for another topic or prefix (rename or delete it, docs/sinks.md)",
			name, info.Config.Subjects, subject, ErrForeignStream))
	}
	if !errors.Is(err, nats.ErrStreamNotFound) {
		return fmt.Errorf("nats sink: stream %s: %w", name, err)
	}
	_, err = js.AddStream(&nats.StreamConfig{
		Name:      name,
		Subjects:  []string{subject},
		Storage:   nats.FileStorage,
		Retention: nats.LimitsPolicy,
		Discard:   nats.DiscardOld,
	}, nats.Context(ctx))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nats.ErrStreamNameAlreadyInUse):
		// Created meanwhile, by a subscriber or another relay: check it.
		return EnsureStream(ctx, js, cfg, topic)
	case isAPIError(err, errCodeSubjectOverlap):
		owner, oerr := js.StreamNameBySubject(subject, nats.Context(ctx))
		if oerr != nil {
			owner = "another stream"
		}
		return core.Permanent(fmt.Errorf("nats sink: create stream %s: subject %s is already captured by stream %s: %w (docs/sinks.md)", name, subject, owner, ErrForeignStream))
	}
	return fmt.Errorf("nats sink: create stream %s: %w", name, err)
}

// errCodeSubjectOverlap is the server's JSStreamSubjectOverlapErr ("subjects
// overlap with an existing stream"), which nats.go has no name for.
const errCodeSubjectOverlap nats.ErrorCode = 10065

func isAPIError(err error, code nats.ErrorCode) bool {
	var apiErr *nats.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == code
}

// subjectMatches reports whether pattern (a stream's subject, maybe with
// wildcards) captures subject (no wildcards).
func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		switch {
		case p == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case p != "*" && p != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
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
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrNoStreamResponse) {
				// No stream took the subject: look the stream up again
				// before the next publish on the topic.
				s.streams.Delete(batch[i].Topic)
			}
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
