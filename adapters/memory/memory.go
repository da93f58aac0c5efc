// Package memory is the in-process sink: a retained, ordered log per topic
// with a Watermill message.Subscriber over it, for the tests and the
// one-process demo. A subscriber that joins late receives every record from
// the first one, in publish order, like a broker with retention; each
// subscription delivers one message at a time and moves on only after Ack
// (a Nack redelivers the same message), so per-aggregate order holds for
// consumers on a Watermill router.
//
// Why not Watermill's gochannel: in persistent mode it replays stored
// messages and fans out live ones from one goroutine per message, and says
// so ("messages order is not guaranteed"); per-account order is the
// guarantee this project exists for, so a sink that reorders cannot pass
// internal/testkit/sinktest.
//
// It can emulate a broker's limits for fault tests: records larger than
// Config.MaxPayloadBytes are rejected permanently (like Kafka's
// MESSAGE_TOO_LARGE), and SetDown makes every Publish fail retryably until
// it is cleared (like a broker outage).
package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/posthorn/posthorn/core"
)

// ErrTooLarge is the permanent error of a record over MaxPayloadBytes.
var ErrTooLarge = errors.New("record larger than the sink accepts")

// ErrDown is the retryable error of an emulated outage.
var ErrDown = errors.New("memory sink is down")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("memory sink closed")

// Config configures the memory sink. The zero value is usable.
type Config struct {
	// MaxPayloadBytes rejects larger payloads permanently; 0 means no limit.
	MaxPayloadBytes int
}

// Sink is the in-process sink and broker.
type Sink struct {
	cfg  Config
	down atomic.Bool

	mu      sync.Mutex
	logs    map[string][]*message.Message
	changed chan struct{} // closed and replaced on every append and on Close
	closed  bool
	done    chan struct{} // closed by Close
	subs    sync.WaitGroup

	closeOnce sync.Once
}

var _ core.Sink = (*Sink)(nil)

// New returns an empty sink.
func New(cfg Config) *Sink {
	return &Sink{cfg: cfg, logs: map[string][]*message.Message{}, changed: make(chan struct{}), done: make(chan struct{})}
}

// SetDown starts (true) or ends (false) an emulated outage.
func (s *Sink) SetDown(down bool) { s.down.Store(down) }

// Publish appends the batch to the topics' logs; records over the payload
// limit fail permanently in a *core.BatchError and the rest are appended.
// The append is the ACK: once Publish returns, every subscriber will see
// the records.
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	if s.down.Load() {
		return ErrDown
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Never deliver a record after a failed predecessor of its aggregate.
	fails := core.BatchFailures{NotSent: "not delivered"}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	for i, e := range batch {
		if fails.Blocked(i, e) {
			continue
		}
		if s.cfg.MaxPayloadBytes > 0 && len(e.Payload) > s.cfg.MaxPayloadBytes {
			fails.Fail(i, e, core.Permanent(fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(e.Payload), s.cfg.MaxPayloadBytes)))
			continue
		}
		s.logs[e.Topic] = append(s.logs[e.Topic], e.ToMessage())
	}
	s.wake()
	return fails.Err()
}

// wake tells the subscriptions waiting for a record to look again; s.mu is
// held.
func (s *Sink) wake() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Records returns a copy of everything published on topic so far, in order.
func (s *Sink) Records(topic string) []*message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*message.Message, len(s.logs[topic]))
	for i, m := range s.logs[topic] {
		out[i] = m.Copy()
	}
	return out
}

// Subscriber reads what the sink published, from the first record.
func (s *Sink) Subscriber() message.Subscriber { return subscriber{s} }

type subscriber struct{ s *Sink }

// Subscribe delivers topic's log from the start, one message at a time,
// until ctx ends or the sink is closed; then the channel is closed.
func (sub subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s := sub.s
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.subs.Add(1)
	s.mu.Unlock()
	out := make(chan *message.Message)
	go func() {
		defer s.subs.Done()
		defer close(out)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { // the sink's Close ends the subscription too
			select {
			case <-s.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		for next := 0; ; {
			s.mu.Lock()
			log, changed, closed := s.logs[topic], s.changed, s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			if next == len(log) {
				select {
				case <-changed:
					continue
				case <-ctx.Done():
					return
				}
			}
			acked, ok := deliver(ctx, out, log[next])
			if !ok {
				return
			}
			if acked {
				next++
			}
		}
	}()
	return out, nil
}

// deliver hands a copy of m to out and waits for its Ack (acked) or Nack
// (not acked: m is delivered again); ok is false when ctx ended first. The
// copy's context ends when deliver returns.
func deliver(ctx context.Context, out chan<- *message.Message, m *message.Message) (acked, ok bool) {
	msg := m.Copy()
	msgCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg.SetContext(msgCtx)
	select {
	case out <- msg:
	case <-ctx.Done():
		return false, false
	}
	select {
	case <-msg.Acked():
		return true, true
	case <-msg.Nacked():
		return false, true
	case <-ctx.Done():
		return false, false
	}
}

// Close of a subscriber closes nothing: subscriptions end with their
// context or with the sink.
func (subscriber) Close() error { return nil }

// Close ends every subscription and refuses further publishing. A second
// Close returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
		close(s.done)
		s.wake()
	})
	s.subs.Wait()
	return nil
}
