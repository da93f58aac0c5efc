package cdc

import (
	"context"
	"errors"
	"sync"
	"time"
)

// streamReader reads and decodes the replication stream in a goroutine of
// its own, ahead of the loop that delivers what it read: up to readAhead
// events (the relay gives two batches), so the next batch is decoded (and
// the WAL sender keeps sending) while the last one is published and
// marked, and memory stays bounded whatever the size of a transaction. It owns the
// connection (a Stream is not safe for concurrent use), so the loop's
// confirmations go through it: confirm records the position and interrupts
// a read that waits for data, and the reader sends it before it reads on.
// It also answers the server's keepalives and sends the confirmed position
// every statusInterval, while the loop is busy delivering as well (a long
// delivery, a sink outage): the WAL sender never times out waiting for a
// reply.
type streamReader struct {
	st             Stream
	statusInterval time.Duration
	silent         bool // Hooks.UnsafeSilentReader: no status while the loop is busy
	events         chan Event
	stop           context.CancelFunc
	done           chan struct{}
	kick           chan struct{} // capacity 1: a confirm is waiting
	err            error         // why reading ended; set before done closes
	broken         bool          // the stream failed under the reader: nothing more may be sent on it
	sent           LSN           // the last position sent; the reader's own until done closes

	mu        sync.Mutex
	want      LSN                // the newest position the loop asked to confirm
	interrupt context.CancelFunc // ends the read in progress, if any
}

func newStreamReader(ctx context.Context, st Stream, readAhead int, statusInterval time.Duration, silent bool) *streamReader {
	ctx, stop := context.WithCancel(ctx)
	sr := &streamReader{st: st, statusInterval: statusInterval, silent: silent, events: make(chan Event, readAhead),
		stop: stop, done: make(chan struct{}), kick: make(chan struct{}, 1)}
	go sr.run(ctx)
	return sr
}

// next returns the next event, or an EventNone event at deadline. An error
// means the stream ended.
func (sr *streamReader) next(ctx context.Context, deadline time.Time) (Event, error) {
	select {
	case ev := <-sr.events:
		return ev, nil
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case ev := <-sr.events:
		return ev, nil
	case <-sr.done:
		// Events read before the end come first.
		select {
		case ev := <-sr.events:
			return ev, nil
		default:
		}
		return Event{}, sr.err
	case <-t.C:
		return Event{}, nil
	case <-ctx.Done():
		return Event{}, ctx.Err()
	}
}

// confirm asks the reader to tell the server that everything up to lsn is
// handled; it returns at once. The reader sends it before its next read.
func (sr *streamReader) confirm(lsn LSN) {
	sr.mu.Lock()
	if lsn > sr.want {
		sr.want = lsn
	}
	if sr.interrupt != nil {
		sr.interrupt()
	}
	sr.mu.Unlock()
	select {
	case sr.kick <- struct{}{}:
	default:
	}
}

// close stops the reader, waits for it, then sends the newest position
// the loop asked to confirm if the reader had not sent it yet (a soft stop
// confirms what it delivered) and the stream did not fail under it; the
// stream itself stays open.
func (sr *streamReader) close(ctx context.Context) {
	sr.stop()
	<-sr.done
	if sr.want > sr.sent && !sr.broken {
		_ = sr.st.Confirm(ctx, sr.want)
	}
}

func (sr *streamReader) run(ctx context.Context) {
	defer close(sr.done)
	lastStatus := time.Now()
	status := func(force bool) error {
		sr.mu.Lock()
		want := sr.want
		sr.mu.Unlock()
		if want == sr.sent && !force && time.Since(lastStatus) < sr.statusInterval {
			return nil
		}
		lastStatus = time.Now()
		// Nothing confirmed in this session yet: the server keeps the
		// slot's own position (a zero would be ignored; say nothing).
		if want == 0 {
			return nil
		}
		if err := sr.st.Confirm(ctx, want); err != nil {
			sr.broken = true
			return err
		}
		sr.sent = want
		return nil
	}
	for {
		if sr.err = status(false); sr.err != nil {
			return
		}
		rctx, cancel := context.WithCancel(ctx)
		sr.mu.Lock()
		sr.interrupt = cancel
		interrupted := sr.want > sr.sent
		sr.mu.Unlock()
		if interrupted {
			cancel() // a confirm came in after status read want
		}
		ev, err := sr.st.Next(rctx, lastStatus.Add(sr.statusInterval))
		sr.mu.Lock()
		sr.interrupt = nil
		sr.mu.Unlock()
		cancel()
		if err != nil {
			// Interrupted by confirm, the connection intact. A read that
			// failed for good while confirm interrupted it ends the
			// stream: sending the confirmation on it would race pgconn's
			// own close.
			if ctx.Err() == nil && errors.Is(err, ErrInterrupted) {
				continue
			}
			sr.err, sr.broken = err, !errors.Is(err, ErrInterrupted)
			return
		}
		switch ev.Kind {
		case EventNone:
			continue
		case EventKeepalive:
			if ev.ReplyRequested {
				if sr.err = status(true); sr.err != nil {
					return
				}
			}
		}
		if sr.err = sr.hand(ctx, ev, status); sr.err != nil {
			return
		}
	}
}

// hand passes ev to the loop, confirming and keeping the WAL sender
// answered while the loop is busy.
func (sr *streamReader) hand(ctx context.Context, ev Event, status func(force bool) error) error {
	for {
		t := time.NewTimer(sr.statusInterval)
		select {
		case sr.events <- ev:
			t.Stop()
			return nil
		case <-sr.kick:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
		if sr.silent {
			continue
		}
		if err := status(false); err != nil {
			return err
		}
	}
}
