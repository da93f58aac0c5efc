package sinktest

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/posthorn/posthorn/core"
)

// RunUniversal runs Watermill's own universal pub/sub tests
// (pubsub/tests.TestPubSub), a suite nobody here wrote, with features, the
// ones the kind honestly has (a case the kind cannot pass is switched off
// there, and docs/sinks.md says why). open returns a publisher over a fresh
// sink (UniversalPublisher: it publishes as the relay does) and the
// subscriber `posthorn consume` opens for the kind, as consumer group. The
// pub/subs the suite asks for without a group share one, as one consumer's
// instances do (the suite's several subscribers of a topic divide its
// messages between them), unless ownGroups gives each a group of its own.
func RunUniversal(t *testing.T, features tests.Features, ownGroups bool, open func(t *testing.T, group string) (message.Publisher, message.Subscriber)) {
	shared := "universal-" + watermill.NewShortUUID()
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			if ownGroups {
				return open(t, "universal-"+watermill.NewShortUUID())
			}
			return open(t, shared)
		},
		tests.ConsumerGroupPubSubConstructor(open))
}

// UniversalPublisher is a Watermill publisher over a core.Sink that makes
// of each message the envelope a relay publishes: event ID = the message's
// UUID, the payload, the metadata as extra headers, one aggregate per
// topic with its revisions in publish order (so a keyed broker keeps the
// topic's messages on one partition, in order). One Publish call is one
// sink batch; it returns once the sink ACKed every message.
type UniversalPublisher struct {
	sink core.Sink

	mu   sync.Mutex
	revs map[string]int64 // topic → last revision
}

var _ message.Publisher = (*UniversalPublisher)(nil)

// NewUniversalPublisher returns a publisher over sink.
func NewUniversalPublisher(sink core.Sink) *UniversalPublisher {
	return &UniversalPublisher{sink: sink, revs: map[string]int64{}}
}

// Publish publishes msgs to topic as one batch.
func (p *UniversalPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock() // one batch at a time keeps the revisions in publish order
	envs := make([]core.Envelope, len(msgs))
	rev := p.revs[topic]
	for i, m := range msgs {
		rev++
		envs[i] = core.Envelope{
			EventID: m.UUID, Kind: core.KindEvent, Type: "universal.message", Topic: topic,
			AggregateType: "universal", AggregateID: "universal", Revision: rev,
			OccurredAt: time.Now().UTC(), Headers: maps.Clone(m.Metadata), Payload: m.Payload,
		}
	}
	ctx, cancel := context.WithTimeout(msgs[0].Context(), time.Minute)
	defer cancel()
	if err := p.sink.Publish(ctx, envs); err != nil {
		return err
	}
	p.revs[topic] = rev
	return nil
}

// Close closes the sink.
func (p *UniversalPublisher) Close() error { return p.sink.Close() }
