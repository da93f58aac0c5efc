// Package saramacontrol is the Kafka sink Posthorn shipped before 2026-12:
// sarama's SyncProducer with idempotence, WaitForAll, one request in flight,
// five internal retries and the producer retired after a retryable failure.
// Under broker SIGKILLs it reports records ACKed that the broker never
// stored (a sarama defect, reported upstream), so it is kept only as the
// negative control of the broker-kill tests and as the baseline of the
// drain benchmark. NewLeaderAck is a second control, for replicated clusters: the
// same sink taking the leader's ACK alone. Production code never imports
// this package (a test in adapters/kafka checks the binary's dependencies).
package saramacontrol

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

// Sink is the old sarama sink.
type Sink struct {
	brokers   []string
	sc        *sarama.Config
	marshaler wmkafka.Marshaler

	mu       sync.Mutex
	producer sarama.SyncProducer
	closed   bool
	inflight sync.WaitGroup
}

var _ core.Sink = (*Sink)(nil)

// New returns the old sink with its exact producer settings.
func New(brokers []string) (*Sink, error) {
	return newSink(brokers, func(sc *sarama.Config) {
		sc.Producer.RequiredAcks = sarama.WaitForAll
		sc.Producer.Idempotent = true
	})
}

// NewLeaderAck returns the sink with the producer settings a replicated
// cluster's writer must not have: acks=1 (the partition leader alone) and
// no idempotence, so a record is ACKed before any follower holds it, and a
// leader that dies right after loses it.
func NewLeaderAck(brokers []string) (*Sink, error) {
	return newSink(brokers, func(sc *sarama.Config) {
		sc.Producer.RequiredAcks = sarama.WaitForLocal
	})
}

func newSink(brokers []string, acks func(*sarama.Config)) (*Sink, error) {
	sc := sarama.NewConfig()
	sc.ClientID = "posthorn-relay"
	sc.Producer.Retry.Max = 5
	acks(sc)
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Partitioner = sarama.NewHashPartitioner
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	return &Sink{
		brokers: brokers,
		sc:      sc,
		marshaler: wmkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(core.HeaderAggregateID), nil
		}),
	}, nil
}

func (s *Sink) getProducer() (sarama.SyncProducer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("sarama control sink closed")
	}
	if s.producer != nil {
		return s.producer, nil
	}
	p, err := sarama.NewSyncProducer(s.brokers, s.sc)
	if err != nil {
		return nil, fmt.Errorf("sarama control: connect: %w", err)
	}
	s.producer = p
	return p, nil
}

func (s *Sink) dropProducer(p sarama.SyncProducer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.producer == p {
		s.producer = nil
		s.inflight.Add(1)
		go func() { defer s.inflight.Done(); _ = p.Close() }()
	}
}

// Publish is the old sink's Publish.
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	if len(batch) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	fails := core.BatchFailures{NotSent: "sarama control: not sent"}
	msgs := make([]*sarama.ProducerMessage, 0, len(batch))
	for i, e := range batch {
		if fails.Blocked(i, e) {
			continue
		}
		pm, err := s.marshaler.Marshal(e.Topic, e.ToMessage())
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
			return fmt.Errorf("sarama control: %w", err)
		}
		for _, pe := range perrs {
			i, _ := pe.Msg.Metadata.(int)
			fails.Fail(i, batch[i], pe.Err)
		}
		s.dropProducer(p)
	}
	return fails.Err()
}

// Close waits for running sends and closes the producer.
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
