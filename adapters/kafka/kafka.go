// Package kafka is the Kafka sink, built on franz-go's kgo producer.
//
// # Delivery contract
//
// Publish returns nil only when the broker acknowledged every record with
// acks=all (every in-sync replica has it). The producer is idempotent: kgo
// numbers each partition's batches and, when a broker fails or restarts,
// bumps the producer epoch and renumbers only what it knows was not stored,
// so a resend after a lost response is stored once and a record is never
// reported stored because a different batch with the same sequence numbers
// was (the failure of the sarama producer this sink replaced: records ACKed
// across a broker SIGKILL that the broker never stored, kept in
// saramacontrol as the negative control). A record is ACKed only through its
// own produce response carrying an offset.
//
// When Publish returns an error, or ctx ends first, the outcome of the
// records not reported ACKed is uncertain: the relay sends them again with
// the same event IDs, the consumers' inbox absorbs the repeats. Records of
// one partition leave the client in the order they were given, so per key
// (aggregate) the broker's order is the batch's order, across retries.
//
// # Format and placement
//
// Records are in watermill-kafka/v3's format (the Watermill UUID header
// carries the event ID, every contract header is a record header, as its
// marshaler lays them out; the sink builds them straight from the envelope,
// without a Watermill message between, which cost a third of the relay's
// CPU), so watermill-kafka's subscriber, and so any consumer on a Watermill
// router, reads them. The record key is the aggregate ID. The
// partition of a key is, by default, the Java client's: (murmur2(key) &
// 0x7fffffff) % partitions, which Kafka Streams and librdkafka's
// murmur2_random agree with, so a service that joins on the account finds
// it on the same partition. PartitionerFNV1a keeps the placement of
// Posthorn's earlier, sarama-based versions (sarama's hash partitioner).
//
// # Errors
//
// Failures a retry cannot fix (a record larger than the producer or broker
// accepts, an invalid or unauthorised topic, a policy violation) are marked
// core.Permanent; everything else is retryable. Per-record failures come back
// as *core.BatchError.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"

	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("kafka sink closed")

// Partitioners of Config.Partitioner (config key sink.kafka.partitioner).
const (
	// PartitionerMurmur2 is the Java client's placement, the default.
	PartitionerMurmur2 = "murmur2"
	// PartitionerFNV1a is sarama's hash partitioner: int32(fnv1a(key)) %
	// partitions, negated when negative; the placement of topics written
	// by Posthorn before the move to kgo.
	PartitionerFNV1a = "fnv1a"
)

// Partitioners are the accepted values of Config.Partitioner.
var Partitioners = []string{PartitionerMurmur2, PartitionerFNV1a}

// MaxRecordBytes is the largest record batch the producer sends (kgo's
// ProducerBatchMaxBytes, Kafka's default max.message.bytes); one record
// that does not fit alone is refused for good before anything is sent.
const MaxRecordBytes = 1_000_000

// Config configures the Kafka sink.
type Config struct {
	Brokers []string
	// Partitioner is PartitionerMurmur2 (also when empty) or PartitionerFNV1a.
	Partitioner string
	// Security is the connections' TLS and SASL (security.go).
	Security Security
	// ExactlyOnce asks for NewExactlyOnce's sink where a caller opens one
	// by configuration (adapters/brokers); New ignores it.
	ExactlyOnce bool
	// TransactionalIDPrefix starts the shards' transactional IDs in
	// exactly-once mode (NewExactlyOnce); empty is
	// TransactionalIDPrefixDefault.
	TransactionalIDPrefix string
	// ClientOpts are extra kgo options (timeouts, a logger) applied before
	// the ones delivery depends on (acks=all, idempotence, the partitioner,
	// the batch size), which always win.
	ClientOpts []kgo.Opt
}

// Sink publishes batches to Kafka.
type Sink struct {
	cl *kgo.Client

	// closed is a flag, not a sinkgate.Gate: Close must not wait for a
	// Publish in progress, whose buffered records it fails.
	closed atomic.Bool

	// produceAfterCancel, set by a negative control only, hands the
	// producer the rest of a batch after Publish's context ended.
	produceAfterCancel bool
}

var _ core.Sink = (*Sink)(nil)

// New returns a sink. kgo connects lazily, so a broker that is down at
// start is retried like any outage instead of failing the relay.
func New(cfg Config) (*Sink, error) {
	opts, err := clientOpts(cfg)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	return &Sink{cl: cl}, nil
}

// clientOpts are the producer options of cfg, for the sink's client and
// for the exactly-once sink's transactional ones.
func clientOpts(cfg Config) ([]kgo.Opt, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka sink: no brokers")
	}
	part, err := partitioner(cfg.Partitioner)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	sec, err := cfg.Security.kgoOpts()
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("posthorn-relay"),
		// Room for a relay batch and the resend of the one before it,
		// whose records may still be retrying when Publish gave up on them.
		kgo.MaxBufferedRecords(20_000),
		// A command topic (commands.<service>) is created on first use
		// where the broker allows it (auto.create.topics.enable), as the
		// sarama producer's metadata requests asked; kgo does not ask by
		// default.
		kgo.AllowAutoTopicCreation(),
		// No linger (kgo's default is 10 ms): a relay batch is handed over
		// whole, and records that arrive while a produce request is in
		// flight are batched anyway; lingering only adds its wait to every
		// record's latency.
		kgo.ProducerLinger(0),
	}, sec...)
	opts = append(opts, cfg.ClientOpts...)
	return append(opts,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(positionsPartitioner{part}),
		kgo.ProducerBatchMaxBytes(MaxRecordBytes),
	), nil
}

// partitioner maps Config.Partitioner to kgo's partitioner.
func partitioner(name string) (kgo.Partitioner, error) {
	switch name {
	case "", PartitionerMurmur2:
		// nil hasher: murmur2, high bit masked, modulo partitions (Java's).
		return kgo.StickyKeyPartitioner(nil), nil
	case PartitionerFNV1a:
		return kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv1a)), nil
	}
	return nil, fmt.Errorf("unknown partitioner %q (want one of %v)", name, Partitioners)
}

func fnv1a(b []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(b)
	return h.Sum32()
}

// Publish sends the batch and returns nil once every record is acknowledged
// by all in-sync replicas. If ctx ends first, Publish returns ctx's error at
// once; records already handed to the producer may still reach the broker
// (the relay resends them with the same event IDs), and records not yet
// sent are failed by the producer.
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	if len(batch) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	fails, recs, index := s.records(batch)
	results := make([]error, len(recs))
	done := make(chan struct{})
	var pending atomic.Int64
	pending.Store(int64(len(recs)) + 1)
	finish := func() {
		if pending.Add(-1) == 0 {
			close(done)
		}
	}
	for j, r := range recs {
		// Once ctx has ended, nothing more is handed over. kgo fails a
		// record that waits for room in its buffer when ctx ends, but
		// takes the next one it is given as soon as there is room,
		// whatever ctx, and may send it (a batch queued behind one in
		// flight is sent without a look at its context): a later
		// revision of an account would reach the broker while an earlier
		// one was refused, and the relay's resend would store the earlier
		// one after it. Stopping here keeps what was handed over, per
		// account, a prefix of the batch.
		if ctx.Err() != nil && !s.produceAfterCancel {
			break
		}
		s.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			results[j] = err
			finish()
		})
	}
	finish()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
	}
	for j, err := range results {
		if err != nil {
			i := index[j]
			fails.Fail(i, batch[i], classify(err))
		}
	}
	// kgo keeps a partition's records in order and fails a failed record's
	// successors in its partition with it, but a key's records may share a
	// partition with another key's failure: report ACKed only what follows
	// no failure of its own aggregate.
	fails.HoldBack(batch)
	return fails.Err()
}

// records builds the records of batch and the index in batch of each,
// failing for good a record that cannot be built and holding back the later
// records of its aggregate: a record is never sent after a predecessor of
// its aggregate that cannot be sent (the aggregate is parked with the first
// one).
func (s *Sink) records(batch []core.Envelope) (fails core.BatchFailures, recs []*kgo.Record, index []int) {
	fails = core.BatchFailures{NotSent: "kafka sink: not sent", Sink: "kafka sink"}
	recs = make([]*kgo.Record, 0, len(batch)+1) // room for a positions record
	index = make([]int, 0, len(batch))
	for i, e := range batch {
		if fails.Blocked(i, e) {
			continue
		}
		r, err := s.record(e)
		if err != nil {
			fails.Fail(i, e, core.Permanent(err))
			continue
		}
		recs = append(recs, r)
		index = append(index, i)
	}
	return fails, recs, index
}

// record builds e's Kafka record in watermill-kafka's format (the UUID
// header first, then the wire headers; the aggregate ID as the key) and
// refuses one that cannot fit in a produce request on its own, or that
// carries Watermill's reserved header itself, as its marshaler would.
func (s *Sink) record(e core.Envelope) (*kgo.Record, error) {
	if _, ok := e.Headers[wmkafka.UUIDHeaderKey]; ok {
		return nil, fmt.Errorf("metadata %s is reserved by watermill for message UUID", wmkafka.UUIDHeaderKey)
	}
	r := &kgo.Record{Topic: e.Topic, Key: []byte(e.AggregateID), Value: e.Payload}
	r.Headers = make([]kgo.RecordHeader, 1, len(e.Headers)+13)
	r.Headers[0] = kgo.RecordHeader{Key: wmkafka.UUIDHeaderKey, Value: []byte(e.EventID)}
	size := 64 + len(r.Key) + len(r.Value) + len(wmkafka.UUIDHeaderKey) + len(e.EventID) + 10 // batch and record overhead, generously
	e.EachWireHeader(func(k, v string) {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		size += len(k) + len(v) + 10
	})
	if size > MaxRecordBytes {
		return nil, fmt.Errorf("%w: record of about %d bytes, more than the %d a produce request takes", kerr.MessageTooLarge, size, MaxRecordBytes)
	}
	return r, nil
}

// classify marks the errors a retry cannot fix as permanent.
func classify(err error) error {
	switch {
	case errors.Is(err, kerr.MessageTooLarge),
		errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.TopicAuthorizationFailed),
		errors.Is(err, kerr.PolicyViolation):
		return core.Permanent(err)
	}
	return err
}

// Close fails the records still buffered (their Publish has returned or
// returns an error) and closes the producer's connections. A second Close
// returns nil.
func (s *Sink) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cl.Close()
	return nil
}
