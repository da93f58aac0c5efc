// Package kafkagroup is the consumers' Kafka subscriber: a sarama
// consumer-group member per consumer and topic that delivers Watermill
// messages (watermill-kafka's marshaling, the one the relay's Kafka sink
// writes with) with pipelined acknowledgements, commits only acknowledged
// prefixes of a partition, re-joins a group whose partition stays behind
// with no commit (the watchdog), supports static membership, and measures
// its offset lag.
//
// Invariant: a committed offset never passes a message whose
// acknowledgement has not arrived, so a crash re-delivers and never skips;
// the inbox behind the subscriber absorbs the repeats.
package kafkagroup

import (
	"errors"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/consumers"
)

// Options are what a Kafka subscriber needs beyond its brokers.
type Options struct {
	// Logger is Watermill's; nil discards.
	Logger watermill.LoggerAdapter
	// Registerer, when set, receives posthorn_consumer_offset_lag and
	// posthorn_consumer_group_rejoins_total.
	Registerer prometheus.Registerer
	// LagInterval is how often the lag is measured (DefaultLagInterval).
	LagInterval time.Duration
	// StallAfter is how long a partition may stay behind with no commit
	// before the consumer re-joins its group (DefaultStallAfter).
	StallAfter time.Duration
	// InstanceID, when set, makes the subscribers static members of their
	// groups (KIP-345) with the instance ID "<InstanceID>.<topic>": a
	// process restarted with the same InstanceID within the session
	// timeout gets its partitions back without a rebalance, where a new
	// dynamic member waits for the dead one's session to time out and a
	// rebalance. A static member does not leave its group when it closes
	// (its partitions wait for it, up to the session timeout). Every
	// process needs its own InstanceID. Needs Kafka 2.4 or later.
	InstanceID string
	// Fenced is called (once a member) when a static member is fenced
	// because another one joined with its instance ID: it stops
	// consuming, and the process should stop rather than take the ID back
	// in turn. Nil logs the error only.
	Fenced func(error)
}

// SaramaConfig is the sarama configuration of the Kafka subscribers:
// Watermill's default with the initial offset set to the oldest record,
// because Watermill's default (newest) makes a consumer group that joins
// late miss everything published before it (field-notes.md).
func SaramaConfig() *sarama.Config {
	c := wmkafka.DefaultSaramaSubscriberConfig()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	// A JoinGroup may block for the whole rebalance timeout while the
	// coordinator waits for a member that died (SIGKILL), but sarama
	// bounds it by Net.ReadTimeout (30 s): with the default 60 s timeout
	// the survivors time out, rejoin and wait again, and the group stalls
	// for minutes (seen in the fault suite over kfake). Keep the rebalance
	// timeout well under the read timeout.
	c.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	// A SIGKILLed member holds its partitions until its session times out;
	// after a consumer kill that wait is most of the time to recovery.
	// 6 s is the broker's floor (group.min.session.timeout.ms, kfake's too;
	// sarama's default is 10 s), with a heartbeat every 2 s.
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Heartbeat.Interval = 2 * time.Second
	// A fetch response is decoded whole before its first record is
	// delivered. At sarama's default of 1 MiB per partition, a member
	// joining a 16-partition topic with a backlog decoded 16 MiB before its
	// first record: 1.3–3 s after the join on a busy 2-core machine, 5–11 s
	// on a saturated one. 256 KiB brought the first record to 0.5–1.7 s on
	// the saturated machine and applied a 200,000-event backlog no slower
	// (three interleaved runs each); 64 KiB halved the rate (each fetch too
	// small to keep the in-flight window full).
	c.Consumer.Fetch.Default = FetchDefault
	return c
}

// FetchDefault is the Kafka subscribers' fetch size per partition.
const FetchDefault = 256 << 10

// Subscriber returns the Kafka subscriber of one consumer: a sarama
// consumer-group member (group = the consumer's name, oldest offset first)
// that delivers up to DefaultInFlight messages per partition ahead of their
// acknowledgements and commits only acknowledged prefixes (member), reads
// watermill-kafka's DefaultMarshaler the relay's Kafka sink writes with
// (message UUID = event ID, metadata = the wire headers), and re-joins its
// group when a partition stops being delivered (groupSubscriber, after
// DefaultStallAfter).
// sec, when given, sets the connections' TLS and SASL (phkafka.Security).
func Subscriber(brokers []string, consumer string, logger watermill.LoggerAdapter, sec ...phkafka.Security) (message.Subscriber, error) {
	return kafkaGroupSubscriber(brokers, consumer, Options{Logger: logger}, nil, false, sec...)
}

// ReadCommittedSubscriber is Subscriber reading with
// read_committed: what a router without Posthorn's inbox needs on a topic
// written in exactly-once mode. A read_uncommitted reader of such a topic
// also receives the records of aborted transactions, which are sent again
// in a later one: the inbox absorbs them as duplicates, other handlers see
// repeats.
func ReadCommittedSubscriber(brokers []string, consumer string, logger watermill.LoggerAdapter, sec ...phkafka.Security) (message.Subscriber, error) {
	return kafkaGroupSubscriber(brokers, consumer, Options{Logger: logger}, nil, true, sec...)
}

// staticVersion is the protocol version static membership needs: JoinGroup
// v5 carries the instance ID. Not higher: at 2.4 sarama's requests (the
// flexible JoinGroup v6 and others) fail to decode against kfake.
var staticVersion = sarama.V2_3_0_0

// kafkaGroupSubscriber reads opts' Logger, StallAfter, InstanceID and
// Fenced.
func kafkaGroupSubscriber(brokers []string, consumer string, opts Options, rejoins prometheus.Counter, readCommitted bool, sec ...phkafka.Security) (*groupSubscriber, error) {
	if len(brokers) == 0 {
		return nil, errors.New("kafka subscriber of " + consumer + ": no brokers")
	}
	sc := SaramaConfig()
	if readCommitted {
		sc.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	for _, s := range sec {
		if err := s.Apply(sc); err != nil {
			return nil, err
		}
	}
	if opts.InstanceID != "" && !sc.Version.IsAtLeast(staticVersion) {
		sc.Version = staticVersion
	}
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = watermill.NopLogger{}
	}
	return newGroupSubscriber(brokers, consumer, sc, opts, rejoins), nil
}

// Factory gives each consumer a group subscriber of its own on brokers,
// with sec's TLS and SASL; with a Registerer, its re-joins
// are counted and its offset lag measured. They read read_uncommitted also
// when the relay writes in exactly-once mode: behind the inbox an aborted
// copy is a duplicate like any other (its event is committed in the ledger,
// and the committed copy follows with the same event ID), and they need not
// wait for the stable offset.
func Factory(brokers []string, sec phkafka.Security, opts Options) (consumers.SubscriberFactory, error) {
	if len(brokers) == 0 {
		return nil, errors.New("kafka subscribers: no brokers")
	}
	brokers = slices.Clone(brokers)
	return func(consumer string) (message.Subscriber, error) {
		var rejoins prometheus.Counter
		if opts.Registerer != nil {
			vec, err := rejoinCounter(opts.Registerer)
			if err != nil {
				return nil, err
			}
			rejoins = vec.WithLabelValues(consumer)
		}
		sub, err := kafkaGroupSubscriber(brokers, consumer, opts, rejoins, false, sec)
		if err != nil || opts.Registerer == nil {
			return sub, err
		}
		return newLagSubscriber(sub, consumer, opts.Registerer, opts.LagInterval)
	}, nil
}
