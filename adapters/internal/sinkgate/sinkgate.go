// Package sinkgate is what the broker sinks share around their own
// publishing. Through a Gate, a Publish after Close fails with the sink's
// own ErrClosed, an empty batch is nothing to do, and a context already done
// is that context's error, all before the sink's own code runs; Close waits
// for the Publish in progress, so a connection is never released under a
// batch still using it, and releases it once. Admit is the first step for
// each record of a batch: a record after a failed one of its aggregate is
// not sent, and one over the broker's payload limit fails for good.
package sinkgate

import (
	"context"
	"fmt"
	"sync"

	"github.com/posthorn/posthorn/core"
)

// Gate guards one sink. Its zero value must be given Closed before use; a
// Gate must not be copied after first use.
type Gate struct {
	// Closed is what Publish returns after Close (the sink's ErrClosed).
	Closed error
	// Serial runs one Publish at a time, for a sink whose connection state
	// serves one batch at a time (RabbitMQ's confirms are per channel);
	// otherwise Publishes run concurrently.
	Serial bool

	mu     sync.RWMutex
	closed bool
}

// Publish returns Closed after Close, nil for an empty batch and ctx's
// error when ctx is done; otherwise it returns publish(ctx, batch), which
// Close waits for.
func (g *Gate) Publish(ctx context.Context, batch []core.Envelope, publish func(context.Context, []core.Envelope) error) error {
	if g.Serial {
		g.mu.Lock()
		defer g.mu.Unlock()
	} else {
		g.mu.RLock()
		defer g.mu.RUnlock()
	}
	if g.closed {
		return g.Closed
	}
	if len(batch) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return publish(ctx, batch)
}

// Close waits for the Publish in progress and returns release(); a second
// Close returns nil without calling it.
func (g *Gate) Close(release func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return release()
}

// Admit reports whether record i of a batch, e, may be sent: not when an
// earlier record of its aggregate failed (fails.Blocked), nor when its
// payload is over maxPayload bytes, which fails it permanently (the error
// starts with sink, e.g. "amqp sink").
func Admit(fails *core.BatchFailures, i int, e core.Envelope, sink string, maxPayload int) bool {
	if fails.Blocked(i, e) {
		return false
	}
	if len(e.Payload) > maxPayload {
		fails.Fail(i, e, core.Permanent(fmt.Errorf("%s: payload of %d bytes over max_payload_bytes %d", sink, len(e.Payload), maxPayload)))
		return false
	}
	return true
}
