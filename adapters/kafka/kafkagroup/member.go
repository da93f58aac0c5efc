package kafkagroup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// DefaultInFlight is how many messages of one partition a Kafka member
// delivers ahead of their acknowledgements.
const DefaultInFlight = 512

// nackResendSleep is how long a nacked message waits before it is
// delivered again (watermill-kafka's default is the same).
const nackResendSleep = 100 * time.Millisecond

// reconsumeSleep is how long a member waits before joining again after
// its group session failed.
const reconsumeSleep = time.Second

// member is one Kafka consumer-group member delivering a topic as Watermill
// messages, with pipelined acknowledgements: watermill-kafka's subscriber
// hands out one message per partition and waits for its ack before the
// next, so a consumer can never have more messages in flight than it has
// partitions and every message costs a full handler round trip. A member
// delivers up to inFlight messages of a partition ahead, in offset order,
// and marks an offset for commit only when it and every message before it
// on the partition are acknowledged: the committed offset never passes a
// message without a committed disposition. A nacked message is delivered
// again (after nackResendSleep) once everything before it is acknowledged;
// messages after it may have been handled meanwhile, which the inbox
// orders (a later revision is held until its predecessor is applied).
//
// The offsets marked are committed by sarama's auto-commit (every
// Consumer.Offsets.AutoCommit.Interval) and when a session ends; after a
// crash the group re-delivers from the last commit and the inbox absorbs
// the repeats. The message context carries the record's partition and
// offset (messagePartition).
type member struct {
	brokers  []string
	group    string
	config   *sarama.Config
	logger   watermill.LoggerAdapter
	inFlight int
	// fenced is Options.Fenced; fencedOnce calls it once.
	fenced     func(error)
	fencedOnce sync.Once

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu     sync.Mutex
	groups []sarama.ConsumerGroup
}

func newMember(brokers []string, group string, config *sarama.Config, logger watermill.LoggerAdapter, inFlight int, fenced func(error)) *member {
	if inFlight <= 0 {
		inFlight = DefaultInFlight
	}
	return &member{brokers: brokers, group: group, config: config, logger: logger, inFlight: inFlight, fenced: fenced, closing: make(chan struct{})}
}

// ignoreFenced is set only in the negative control of the fenced member's
// stop (export_test.go).
var ignoreFenced atomic.Bool

// isFenced reports err as the member's fencing, unless the member is
// stopping (a watchdog re-join replaces its own static member): a fenced
// member must not join again, which would fence the other in turn.
func (m *member) isFenced(err error) bool {
	if ignoreFenced.Load() || !errors.Is(err, sarama.ErrFencedInstancedId) || isDone(m.closing) {
		return false
	}
	m.fencedOnce.Do(func() {
		err := fmt.Errorf("kafka consumer group %s: another member joined with this one's instance ID %s (each process needs its own)",
			m.group, m.config.Consumer.Group.InstanceId)
		m.logger.Error("Kafka static member fenced; it stops consuming", err, watermill.LogFields{"consumer_group": m.group})
		if m.fenced != nil {
			m.fenced(err)
		}
	})
	return true
}

// Subscribe joins the group on topic; the channel closes when ctx ends or
// the member is closed.
func (m *member) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	cg, err := sarama.NewConsumerGroup(m.brokers, m.group, m.config)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	select {
	case <-m.closing:
		m.mu.Unlock()
		_ = cg.Close()
		return nil, errClosed
	default:
	}
	m.groups = append(m.groups, cg)
	m.wg.Add(2)
	m.mu.Unlock()
	out := make(chan *message.Message)
	fields := watermill.LogFields{"consumer_group": m.group, "topic": topic}
	subscribed := time.Now()
	go func() {
		defer m.wg.Done()
		for err := range cg.Errors() {
			if !m.isFenced(err) {
				m.logger.Error("Kafka consumer group error", err, fields)
			}
		}
	}()
	go func() {
		defer m.wg.Done()
		defer close(out)
		h := &claimHandler{ctx: ctx, out: out, closing: m.closing, inFlight: m.inFlight, topic: topic,
			logger: m.logger, fields: fields, subscribed: subscribed}
		for {
			err := cg.Consume(ctx, []string{topic}, h)
			if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil || isDone(m.closing) || m.isFenced(err) {
				return
			}
			if err != nil {
				m.logger.Error("Kafka group session failed; joining again", err, fields)
				if !pause(ctx, m.closing, reconsumeSleep) {
					return
				}
			}
		}
	}()
	return out, nil
}

// stop tells the member's goroutines to end, without waiting for them.
func (m *member) stop() { m.closeOnce.Do(func() { close(m.closing) }) }

// Close leaves the group (committing what is marked; a static member stays
// in it until its session times out) and waits for the member's
// goroutines.
func (m *member) Close() error {
	m.mu.Lock()
	m.stop()
	groups := m.groups
	m.groups = nil
	m.mu.Unlock()
	return closeAll(groups, &m.wg)
}

// closeAll closes every part, then waits for wg: the end of a Kafka
// subscriber's Close, once it has signalled its goroutines to stop.
func closeAll[C interface{ Close() error }](parts []C, wg *sync.WaitGroup) error {
	var errs []error
	for _, p := range parts {
		errs = append(errs, p.Close())
	}
	wg.Wait()
	return errors.Join(errs...)
}

type claimHandler struct {
	ctx      context.Context
	out      chan<- *message.Message
	closing  <-chan struct{}
	inFlight int
	topic    string

	logger watermill.LoggerAdapter
	fields watermill.LogFields
	// subscribed is when Subscribe was called: the start-up log lines
	// say how long the join and the first fetch took from there.
	subscribed  time.Time
	firstRecord sync.Once
}

// The start-up log lines of a member, at INFO, each with consumer_group,
// topic and "after" (the time since Subscribe).
const (
	// SessionLogMessage is logged at the start of every group session
	// (the join and every rebalance), with the generation and the
	// partitions claimed.
	SessionLogMessage = "Kafka consumer group session began"
	// FirstRecordLogMessage is logged once per member, when it delivers
	// its first record.
	FirstRecordLogMessage = "Kafka consumer delivered its first record"
)

func (h *claimHandler) Setup(sess sarama.ConsumerGroupSession) error {
	claimed := 0
	for _, ps := range sess.Claims() {
		claimed += len(ps)
	}
	h.logger.Info(SessionLogMessage, h.fields.Add(watermill.LogFields{"generation": sess.GenerationID(),
		"partitions": claimed, "after": time.Since(h.subscribed).Round(time.Millisecond).String()}))
	return nil
}

func (*claimHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

type delivered struct {
	record *sarama.ConsumerMessage
	msg    *message.Message
	// done cancels the message's context, as Watermill's subscribers do
	// once a message is acknowledged: here once it and every message
	// before it on the partition are, or when its claim ends.
	done context.CancelFunc
}

// pause waits d and reports true, or false as soon as ctx ends or stop is
// closed.
func pause(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
	case <-stop:
	}
	return false
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// ConsumeClaim delivers one partition's records in offset order, up to
// inFlight ahead of their acknowledgements, and marks the longest
// acknowledged prefix.
func (h *claimHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel() // unacknowledged messages of a claim that ended are delivered again to its next owner
	var q []delivered
	records := claim.Messages()
	for {
		in := records
		if len(q) >= h.inFlight {
			in = nil
		}
		var acked, nacked <-chan struct{}
		if len(q) > 0 {
			acked, nacked = q[0].msg.Acked(), q[0].msg.Nacked()
		}
		select {
		case r, ok := <-in:
			if !ok {
				return nil // the claim ended (rebalance or close)
			}
			msg := unmarshal(r)
			mctx, done := context.WithCancel(withRecord(ctx, r))
			msg.SetContext(mctx)
			if !h.send(sess, msg) {
				done()
				return nil
			}
			q = append(q, delivered{record: r, msg: msg, done: done})
			h.firstRecord.Do(func() {
				h.logger.Info(FirstRecordLogMessage, h.fields.Add(watermill.LogFields{
					"after": time.Since(h.subscribed).Round(time.Millisecond).String()}))
			})
		case <-acked:
			for len(q) > 0 && isDone(q[0].msg.Acked()) {
				sess.MarkMessage(q[0].record, "")
				q[0].done()
				q = q[1:]
			}
		case <-nacked:
			select {
			case <-time.After(nackResendSleep):
			case <-sess.Context().Done():
				return nil
			case <-h.closing:
				return nil
			}
			again := q[0].msg.Copy()
			again.SetContext(q[0].msg.Context())
			if !h.send(sess, again) {
				return nil
			}
			q[0].msg = again
		case <-sess.Context().Done():
			return nil
		case <-h.closing:
			return nil
		}
	}
}

func (h *claimHandler) send(sess sarama.ConsumerGroupSession, msg *message.Message) bool {
	select {
	case h.out <- msg:
		return true
	case <-sess.Context().Done():
	case <-h.closing:
	case <-h.ctx.Done():
	}
	return false
}

// recordKey is the context key of the record a message came from.
type recordKey struct{}

// recordInfo is what a message's context tells of its record: one value,
// where three context values cost three allocations a message.
type recordInfo struct {
	partition int32
	offset    int64
	timestamp time.Time
}

func withRecord(ctx context.Context, r *sarama.ConsumerMessage) context.Context {
	return context.WithValue(ctx, recordKey{}, &recordInfo{partition: r.Partition, offset: r.Offset, timestamp: r.Timestamp})
}

// RecordTimestamp returns the Kafka record timestamp of a message the Kafka
// subscriber delivered (the producer's send time, as the relay's sink sets
// it), e.g. to split a consumer's lag into the relay's part and its own.
func RecordTimestamp(ctx context.Context) (time.Time, bool) {
	r, ok := ctx.Value(recordKey{}).(*recordInfo)
	if !ok || r.timestamp.IsZero() {
		return time.Time{}, false
	}
	return r.timestamp, true
}

// messagePartition returns the Kafka partition and offset of a message a
// member delivered.
func messagePartition(ctx context.Context) (partition int32, offset int64, ok bool) {
	r, ok := ctx.Value(recordKey{}).(*recordInfo)
	if !ok {
		return 0, 0, false
	}
	return r.partition, r.offset, true
}

// unmarshal is watermill-kafka's DefaultMarshaler.Unmarshal (the record's
// headers become the message's metadata, its _watermill_message_uuid
// header the message UUID, its value the payload) with a handful of
// allocations instead of two per header: the headers' keys and values are
// copied into one string and sliced from it. It cannot fail.
func unmarshal(r *sarama.ConsumerMessage) *message.Message {
	n := 0
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	var b strings.Builder
	b.Grow(n)
	for _, h := range r.Headers {
		b.Write(h.Key)
		b.Write(h.Value)
	}
	all := b.String()
	var uuid string
	metadata := make(message.Metadata, len(r.Headers))
	for _, h := range r.Headers {
		k := all[:len(h.Key)]
		v := all[len(h.Key) : len(h.Key)+len(h.Value)]
		all = all[len(h.Key)+len(h.Value):]
		if k == wmkafka.UUIDHeaderKey {
			uuid = v
		} else {
			metadata[k] = v
		}
	}
	msg := message.NewMessage(uuid, r.Value)
	msg.Metadata = metadata
	return msg
}
