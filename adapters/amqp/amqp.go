// Package amqp is the RabbitMQ sink. Records are written in
// watermill-amqp/v3's format (its DefaultMarshaler builds them: the header
// _watermill_message_uuid carries the event ID, every contract header is an
// AMQP header, delivery mode persistent), so watermill-amqp's subscriber,
// and so any consumer on a Watermill router, reads them.
//
// Topology (Topology below; the subscribers use the same names): one
// durable fanout exchange per topic (ExchangePrefix + topic) and, for each
// consumer, one durable queue bound to it (exchange + "_" + consumer). The
// names are one-to-one with (topic, consumer): a topic holding '_' or '~',
// or one too long for RabbitMQ's 255-byte names, is written in them as a
// readable part without '_', '~' and 128 bits of its SHA-256, so the queue
// of wallet_x's consumer c is never the queue of wallet's consumer x_c. On a
// command topic (commands.<service>) only the command's owner has a queue
// (Config.CommandOwners, default the consumer named like the service). The
// sink declares the queues of the configured consumers itself, so events
// published before a consumer first starts wait in its queue. A queue is
// FIFO and each consumer reads its queue with prefetch 1, so per-account
// order holds.
//
// Delivery: the channel is in confirm mode; a batch is published
// pipelined, mandatory, with the event ID as message ID, and Publish
// returns nil only when RabbitMQ has confirmed (basic.ack) every record.
// For a persistent message routed to durable queues RabbitMQ confirms after
// the message is written to disk. A record that no queue takes is returned
// by the broker (basic.return) and reported as a retryable failure instead
// of an ACK: an unbound exchange would otherwise swallow it. A nack is
// retryable. RabbitMQ has no idempotent publish: resends are absorbed by
// the consumers' inbox.
//
// Errors: a record over MaxPayloadBytes (RabbitMQ's max_message_size) is
// permanent, and its aggregate's later records in the batch are not sent;
// everything else (connection or channel loss, nacks, returns, timeouts) is
// retryable, and the connection is rebuilt on the next Publish.
package amqp

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/posthorn/posthorn/adapters/internal/sinkgate"
	"github.com/posthorn/posthorn/core"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("amqp sink closed")

// ErrUnroutable is the retryable error of a record no queue took.
var ErrUnroutable = errors.New("record returned by the broker: no queue is bound to its exchange")

// MaxPayloadBytesDefault is RabbitMQ's default max_message_size (128 MiB).
const MaxPayloadBytesDefault = 128 << 20

// Config configures the RabbitMQ sink; only URL is required.
type Config struct {
	// URL is amqp:// or amqps://, credentials and vhost may be in it.
	URL string
	// Username and Password, when set, replace the URL's credentials.
	Username, Password string
	// TLS, when set, is used for amqps:// connections.
	TLS *tls.Config
	// ExchangePrefix is prepended to every topic to name its exchange.
	ExchangePrefix string
	// Consumers are the consumers whose queues the sink declares and binds
	// on event topics.
	Consumers []string
	// CommandTopicPrefix marks command topics (default core's "commands.").
	// A command has one owner: on a command topic the sink declares and
	// binds only the owner's queue, never the event consumers' (who would
	// never read it, so it would only grow).
	CommandTopicPrefix string
	// CommandOwners maps a command topic's service (commands.<service>) to
	// the consumer that owns it; a service not listed is owned by the
	// consumer named like the service.
	CommandOwners map[string]string
	// MaxPayloadBytes rejects larger payloads permanently; default
	// MaxPayloadBytesDefault. Set it to the broker's max_message_size.
	MaxPayloadBytes int
	// ConnectTimeout bounds dialling; default 2 s.
	ConnectTimeout time.Duration
}

// Topology names the exchanges and queues of Config.
type Topology struct{ ExchangePrefix string }

// maxName is RabbitMQ's limit on exchange and queue names, in bytes.
const maxName = 255

// Exchange is topic's exchange: ExchangePrefix + topic, or + the topic's
// hashed form (hashedTopic) when the topic holds '~' (the hashed form's
// marker) or the name would be too long.
func (tp Topology) Exchange(topic string) string {
	if !strings.Contains(topic, "~") && len(tp.ExchangePrefix)+len(topic) <= maxName {
		return tp.ExchangePrefix + topic
	}
	return tp.ExchangePrefix + hashedTopic(topic)
}

// Queue is consumer's queue on topic: ExchangePrefix, the topic, '_' and
// the consumer. The topic part never holds '_' (a topic that does is
// written in its hashed form), so the first '_' after the prefix ends it
// and no two (topic, consumer) pairs share a queue.
func (tp Topology) Queue(topic, consumer string) string {
	if !strings.ContainsAny(topic, "_~") && len(tp.ExchangePrefix)+len(topic)+1+len(consumer) <= maxName {
		return tp.ExchangePrefix + topic + "_" + consumer
	}
	return tp.ExchangePrefix + hashedTopic(topic) + "_" + consumer
}

// hashedTopic is a readable part of topic (its first 64 bytes, each but
// ASCII letters, digits, '.', ':' and '-' replaced by '-'), then '~' and 32
// hex digits of the topic's SHA-256.
func hashedTopic(topic string) string {
	sum := sha256.Sum256([]byte(topic))
	readable := []byte(topic[:min(len(topic), 64)])
	for i, b := range readable {
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == ':' || b == '-') {
			readable[i] = '-'
		}
	}
	return string(readable) + "~" + hex.EncodeToString(sum[:16])
}

// DialURL is the URL with Username and Password applied.
func (cfg Config) DialURL() (string, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
		return "", fmt.Errorf("amqp sink: URL must be amqp:// or amqps://")
	}
	if cfg.Username != "" || cfg.Password != "" {
		u.User = url.UserPassword(cfg.Username, cfg.Password)
	}
	return u.String(), nil
}

// AMQPConfig is the amqp091 client configuration of cfg (TLS, timeouts).
func (cfg Config) AMQPConfig() amqp.Config {
	timeout := cfg.ConnectTimeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	return amqp.Config{
		Heartbeat:       10 * time.Second,
		TLSClientConfig: cfg.TLS,
		Locale:          "en_US",
		Dial:            amqp.DefaultDial(timeout),
		Properties:      amqp.Table{"connection_name": "posthorn"},
	}
}

// Sink publishes batches to RabbitMQ.
type Sink struct {
	cfg       Config
	url       string
	tp        Topology
	marshaler wmamqp.DefaultMarshaler

	// gate is Serial (confirms are per channel), so it guards the fields
	// below too.
	gate     sinkgate.Gate
	conn     *amqp.Connection
	ch       *amqp.Channel
	returns  chan amqp.Return
	declared map[string]bool
}

var _ core.Sink = (*Sink)(nil)

// New checks cfg; it connects on the first Publish, so a broker that is down
// at start is retried like any outage instead of failing the relay.
func New(cfg Config) (*Sink, error) {
	u, err := cfg.DialURL()
	if err != nil {
		return nil, err
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = MaxPayloadBytesDefault
	}
	return &Sink{cfg: cfg, url: u, tp: Topology{cfg.ExchangePrefix}, gate: sinkgate.Gate{Closed: ErrClosed, Serial: true}}, nil
}

func (s *Sink) connect() error {
	if s.ch != nil && !s.ch.IsClosed() && !s.conn.IsClosed() {
		return nil
	}
	s.drop()
	conn, err := amqp.DialConfig(s.url, s.cfg.AMQPConfig())
	if err != nil {
		return fmt.Errorf("amqp sink: connect: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("amqp sink: confirm-mode channel: %w", err)
	}
	s.conn, s.ch, s.declared = conn, ch, map[string]bool{}
	s.returns = ch.NotifyReturn(make(chan amqp.Return, 1024))
	return nil
}

func (s *Sink) drop() {
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.conn, s.ch = nil, nil
}

// declare declares topic's exchange and the configured consumers' queues,
// with the arguments watermill-amqp's durable pub/sub subscriber uses, so
// either side may declare first.
func (s *Sink) declare(topic string) error {
	if s.declared[topic] {
		return nil
	}
	ex := s.tp.Exchange(topic)
	if err := s.ch.ExchangeDeclare(ex, "fanout", true, false, false, false, nil); err != nil {
		return fmt.Errorf("amqp sink: declare exchange %s: %w", ex, err)
	}
	for _, c := range s.cfg.queueOwners(topic) {
		q := s.tp.Queue(topic, c)
		if _, err := s.ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp sink: declare queue %s: %w", q, err)
		}
		if err := s.ch.QueueBind(q, "", ex, false, nil); err != nil {
			return fmt.Errorf("amqp sink: bind queue %s: %w", q, err)
		}
	}
	s.declared[topic] = true
	return nil
}

// queueOwners are the consumers whose queues topic's exchange routes to:
// the command's owner alone on a command topic, the event consumers on any
// other.
func (cfg Config) queueOwners(topic string) []string {
	prefix := cfg.CommandTopicPrefix
	if prefix == "" {
		prefix = core.CommandTopicPrefix
	}
	service, isCommand := strings.CutPrefix(topic, prefix)
	if !isCommand || service == "" {
		return cfg.Consumers
	}
	if owner := cfg.CommandOwners[service]; owner != "" {
		return []string{owner}
	}
	return []string{service}
}

// Publish sends the batch and returns nil once RabbitMQ has confirmed every
// record. If ctx ends first, Publish returns ctx's error and drops the
// connection; records already sent may or may not be stored (the relay
// resends them with the same event IDs).
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	return s.gate.Publish(ctx, batch, s.publish)
}

func (s *Sink) publish(ctx context.Context, batch []core.Envelope) error {
	if err := s.connect(); err != nil {
		return err
	}
	fails := core.BatchFailures{NotSent: "amqp sink: not sent", Sink: "amqp sink"}
	confirms := make([]*amqp.DeferredConfirmation, len(batch))
	byID := map[string]int{}
	for i, e := range batch {
		if !sinkgate.Admit(&fails, i, e, "amqp sink", s.cfg.MaxPayloadBytes) {
			continue
		}
		if err := s.declare(e.Topic); err != nil {
			s.drop()
			return err
		}
		p, err := s.marshaler.Marshal(e.ToMessage())
		if err != nil {
			fails.Fail(i, e, core.Permanent(err))
			continue
		}
		p.MessageId = e.EventID
		dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, s.tp.Exchange(e.Topic), "", true, false, p)
		if err != nil {
			// The channel is gone: nothing after this can be sent either.
			s.drop()
			return fmt.Errorf("amqp sink: publish: %w", err)
		}
		confirms[i] = dc
		byID[e.EventID] = i
	}
	returned := func(r amqp.Return) {
		if i, ok := byID[r.MessageId]; ok {
			fails.Fail(i, batch[i], fmt.Errorf("amqp sink: %w (exchange %s: %s)", ErrUnroutable, r.Exchange, r.ReplyText))
		}
	}
	// returns is nil once the library closed it (the channel died with the
	// broker): a receive on a closed channel never blocks, and the loops
	// below would spin on it instead of waiting for the confirms.
	returns := s.returns
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
	wait:
		for {
			select {
			case <-dc.Done():
				break wait
			case r, ok := <-returns: // a return precedes its record's ack
				if !ok {
					returns = nil
					continue
				}
				returned(r)
			case <-ctx.Done():
				s.drop()
				return ctx.Err()
			}
		}
		if !dc.Acked() && fails.Failed(i) == nil {
			err := errors.New("amqp sink: broker nacked the record")
			if s.ch.IsClosed() {
				err = errors.New("amqp sink: channel closed before the record was confirmed")
			}
			fails.Fail(i, batch[i], err)
		}
	}
	for drained := returns == nil; !drained; {
		select {
		case r, ok := <-returns:
			if !ok {
				drained = true
				continue
			}
			returned(r)
		default:
			drained = true
		}
	}
	// A record whose predecessor of the same aggregate failed after sending
	// is not reported ACKed: its marker must not come before its
	// predecessor's.
	fails.HoldBack(batch)
	if s.ch.IsClosed() {
		s.drop()
	}
	return fails.Err()
}

// Close waits for a Publish in progress and closes the connection; a second
// Close returns nil.
func (s *Sink) Close() error {
	return s.gate.Close(func() error {
		s.drop()
		return nil
	})
}
