// Package kafka is the Kafka sink. Records are written in watermill-kafka/v3's
// format (its marshaler builds them: the Watermill UUID header carries the
// event ID, every contract header is a record header) so watermill-kafka's
// subscriber, and so any consumer on a Watermill router, reads them. The
// record key is the aggregate ID and sarama's hash partitioner (FNV-1a, the
// same one watermill-kafka's publisher uses by default) places it, so one
// account always lands on one partition and keeps its order there.
//
// Delivery: a batch is sent with SyncProducer.SendMessages, which returns
// only when every record is acknowledged by all in-sync replicas
// (RequiredAcks = WaitForAll) or has failed. The producer is idempotent with
// one request in flight per broker, so sarama's internal retries neither
// duplicate nor reorder records within a partition.
//
// Errors: failures that a retry cannot fix (a record larger than the broker
// or the producer accepts, an invalid or unauthorised topic) are marked
// core.Permanent; everything else is retryable. Per-record failures come back
// as *core.BatchError. After a batch in which every record failed retryably
// (a broker outage), the producer is rebuilt on the next Publish, so a
// restarted broker is found again.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/posthorn/posthorn/core"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("kafka sink closed")

// Config configures the Kafka sink.
type Config struct {
	Brokers []string
	// Sarama overrides the producer configuration; nil means DefaultSaramaConfig.
	// The settings that delivery depends on (acks, idempotence, one request in
	// flight, hash partitioner, returned successes) are forced either way.
	Sarama *sarama.Config
	// Security is the connections' TLS and SASL (security.go); applied
	// over Sarama.
	Security Security
}

// DefaultSaramaConfig is the producer configuration the sink starts from.
func DefaultSaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "posthorn-relay"
	c.Producer.Retry.Max = 5
	return c
}

func (c *Config) producerConfig() *sarama.Config {
	sc := c.Sarama
	if sc == nil {
		sc = DefaultSaramaConfig()
	}
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Idempotent = true
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Partitioner = sarama.NewHashPartitioner
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	return sc
}

// Sink publishes batches to Kafka.
type Sink struct {
	cfg       Config
	sc        *sarama.Config // built once: sarama reads it from its goroutines
	marshaler wmkafka.Marshaler

	mu       sync.Mutex
	producer sarama.SyncProducer
	closed   bool
	inflight sync.WaitGroup
}

var _ core.Sink = (*Sink)(nil)

// New returns a sink; it connects on the first Publish, so a broker that is
// down at start is retried like any outage instead of failing the relay.
func New(cfg Config) (*Sink, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka sink: no brokers")
	}
	sc := cfg.producerConfig()
	if err := cfg.Security.Apply(sc); err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	return &Sink{
		cfg: cfg,
		sc:  sc,
		marshaler: wmkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(core.HeaderAggregateID), nil
		}),
	}, nil
}

func (s *Sink) getProducer() (sarama.SyncProducer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.producer != nil {
		return s.producer, nil
	}
	p, err := sarama.NewSyncProducer(s.cfg.Brokers, s.sc)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: connect: %w", err)
	}
	s.producer = p
	return p, nil
}

// dropProducer closes p (if it is still the current producer) once the
// sends using it have returned; the next Publish connects afresh.
func (s *Sink) dropProducer(p sarama.SyncProducer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.producer == p {
		s.producer = nil
		s.inflight.Add(1)
		go func() { defer s.inflight.Done(); _ = p.Close() }()
	}
}

// Publish sends the batch and returns nil once every record is acknowledged
// by all in-sync replicas. If ctx ends first, Publish returns ctx's error at
// once; the send goes on in the background and its records may or may not
// reach the broker (the relay resends them with the same event IDs).
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	if len(batch) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Never send a record after a predecessor of its aggregate that cannot
	// be sent: the aggregate is parked with the first one.
	fails := core.BatchFailures{NotSent: "kafka sink: not sent"}
	msgs := make([]*sarama.ProducerMessage, 0, len(batch))
	maxBytes := s.sc.Producer.MaxMessageBytes
	for i, e := range batch {
		if fails.Blocked(i, e) {
			continue
		}
		pm, err := s.marshaler.Marshal(e.Topic, e.ToMessage())
		if err == nil && recordSize(pm) > maxBytes {
			err = fmt.Errorf("%w: record of about %d bytes, Producer.MaxMessageBytes %d", sarama.ErrMessageSizeTooLarge, recordSize(pm), maxBytes)
		}
		if err != nil {
			fails.Fail(i, e, core.Permanent(err))
			continue
		}
		pm.Metadata = i
		msgs = append(msgs, pm)
	}
	p, err := s.getProducer()
	if err != nil {
		return err
	}
	s.inflight.Add(1)
	done := make(chan error, 1)
	go func() {
		defer s.inflight.Done()
		done <- p.SendMessages(msgs)
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err = <-done:
	}
	if err != nil {
		var perrs sarama.ProducerErrors
		if !errors.As(err, &perrs) {
			s.dropProducer(p)
			return fmt.Errorf("kafka sink: %w", err)
		}
		retryable := 0
		for _, pe := range perrs {
			i, _ := pe.Msg.Metadata.(int)
			ferr := classify(pe.Err)
			fails.Fail(i, batch[i], ferr)
			if !core.IsPermanent(ferr) {
				retryable++
			}
		}
		// Any retryable failure retires the producer: the relay resends
		// those records, and a fresh producer ID starts its sequence numbers
		// afresh instead of carrying them across a failure the broker may
		// have seen differently (an out-of-order sequence after a broker
		// restart; a broker that takes a resend for a duplicate
		// acknowledges it without storing it).
		if retryable > 0 {
			s.dropProducer(p)
		}
	}
	return fails.Err()
}

// recordSize estimates a record's size as sarama's limit check sees it
// (payload, key, headers and per-record overhead), so a record that sarama
// would refuse is refused before the batch is sent, and its aggregate's
// later records in the batch are held back with it.
func recordSize(pm *sarama.ProducerMessage) int {
	n := 36 + pm.Value.Length()
	if pm.Key != nil {
		n += pm.Key.Length()
	}
	for _, h := range pm.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// classify marks the errors a retry cannot fix as permanent.
func classify(err error) error {
	var cfgErr sarama.ConfigurationError
	switch {
	case errors.As(err, &cfgErr):
		// Raised before sending, e.g. a record over Producer.MaxMessageBytes:
		// the same record fails the same way every time.
		return core.Permanent(err)
	case errors.Is(err, sarama.ErrMessageSizeTooLarge),
		errors.Is(err, sarama.ErrInvalidMessage),
		errors.Is(err, sarama.ErrInvalidMessageSize),
		errors.Is(err, sarama.ErrInvalidTopic),
		errors.Is(err, sarama.ErrTopicAuthorizationFailed),
		errors.Is(err, sarama.ErrInvalidRecord),
		errors.Is(err, sarama.ErrPolicyViolation):
		return core.Permanent(err)
	}
	return err
}

// Close waits for sends still running (after a cancelled Publish) and
// closes the producer. A second Close returns nil.
func (s *Sink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	p := s.producer
	s.producer = nil
	s.mu.Unlock()
	s.inflight.Wait()
	if p != nil {
		return p.Close()
	}
	return nil
}
