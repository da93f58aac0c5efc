// Package watermillsink makes any Watermill message.Publisher a core.Sink.
//
// Records are grouped by topic, keeping their batch order within each topic,
// and each group goes to the publisher in one Publish call. The publisher's
// own definition of "published" is the ACK: Watermill publishers return from
// Publish once their broker confirmed (or, for gochannel, once the message
// is handed over). A failed group fails all its records in a
// *core.BatchError; its error is permanent only if the publisher marked it
// with core.Permanent, because a generic publisher cannot tell.
//
// Per-aggregate order holds because an aggregate's records always share a
// topic, and within a topic the batch order is kept.
package watermillsink

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/posthorn/posthorn/core"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("sink closed")

// Sink publishes through a Watermill publisher.
type Sink struct {
	pub    message.Publisher
	closed atomic.Bool
}

var _ core.Sink = (*Sink)(nil)

// New wraps pub; Close closes pub.
func New(pub message.Publisher) *Sink { return &Sink{pub: pub} }

// Publish publishes batch topic by topic. Cancellation is checked between
// topics and passed to the messages' context; a publisher that ignores it
// may still finish its current call.
func (s *Sink) Publish(ctx context.Context, batch []core.Envelope) error {
	if s.closed.Load() {
		return ErrClosed
	}
	var (
		order  []string
		groups = map[string][]int{}
	)
	for i, e := range batch {
		if _, ok := groups[e.Topic]; !ok {
			order = append(order, e.Topic)
		}
		groups[e.Topic] = append(groups[e.Topic], i)
	}
	failed := map[int]error{}
	for _, topic := range order {
		idx := groups[topic]
		if err := ctx.Err(); err != nil {
			for _, i := range idx {
				failed[i] = err
			}
			continue
		}
		msgs := make([]*message.Message, len(idx))
		for j, i := range idx {
			msgs[j] = batch[i].ToMessage()
			msgs[j].SetContext(ctx)
		}
		if err := s.pub.Publish(topic, msgs...); err != nil {
			for _, i := range idx {
				failed[i] = err
			}
		}
	}
	if len(failed) > 0 {
		return &core.BatchError{Failed: failed}
	}
	return nil
}

// Close closes the publisher; a second Close returns nil.
func (s *Sink) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.pub.Close()
}
