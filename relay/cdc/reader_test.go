package cdc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// interruptStream is a Stream whose reads wait until their context ends.
// A real server cannot be made to drop the connection at the instant a
// confirmation interrupts a read, so this one does it on demand: with
// dies set, the interrupted read fails for good, as pgconn's does when the
// connection broke meanwhile (it then closes the connection itself, and a
// later write races that close).
type interruptStream struct {
	dies    bool
	reading chan struct{} // told each time a read starts to wait

	mu        sync.Mutex
	dead      bool
	confirmed []LSN
	afterDead []LSN // confirmations sent on the failed stream
}

var errConnectionLost = errors.New("connection lost")

func (s *interruptStream) Next(ctx context.Context, deadline time.Time) (Event, error) {
	s.mu.Lock()
	dead := s.dead
	s.mu.Unlock()
	if dead {
		return Event{}, errConnectionLost
	}
	select {
	case s.reading <- struct{}{}:
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-t.C:
		return Event{Kind: EventNone}, nil
	case <-ctx.Done():
	}
	if s.dies {
		s.mu.Lock()
		s.dead = true
		s.mu.Unlock()
		return Event{}, errConnectionLost
	}
	return Event{}, fmt.Errorf("%w: %w", ErrInterrupted, ctx.Err())
}

func (s *interruptStream) Confirm(_ context.Context, lsn LSN) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		s.afterDead = append(s.afterDead, lsn)
		return errConnectionLost
	}
	s.confirmed = append(s.confirmed, lsn)
	return nil
}

func (s *interruptStream) BackendPID() uint32          { return 0 }
func (s *interruptStream) Close(context.Context) error { return nil }

func (s *interruptStream) sent() (confirmed, afterDead []LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]LSN(nil), s.confirmed...), append([]LSN(nil), s.afterDead...)
}

// A confirmation interrupts the waiting read, is sent, and reading goes on.
func TestReaderConfirmsAndReadsOnAfterAnInterrupt(t *testing.T) {
	st := &interruptStream{reading: make(chan struct{}, 1)}
	sr := newStreamReader(context.Background(), st, 2, time.Hour, false)
	<-st.reading
	sr.confirm(5)
	wait.For(t, 10*time.Second, "the interrupted reader to send the confirmation", func() bool {
		confirmed, _ := st.sent()
		return len(confirmed) == 1 && confirmed[0] == 5
	})
	select {
	case <-sr.done:
		t.Fatalf("the reader ended after an interrupt on an intact stream: %v", sr.err)
	case <-time.After(50 * time.Millisecond):
	}
	sr.close(context.Background())
}

// A read that fails for good just as a confirmation interrupts it ends the
// reader, and nothing is sent on the failed stream: not by the reader, not
// by close. The reader used to take any read that ended after an interrupt
// for the interrupt, and confirmed on the broken connection.
func TestReaderStopsWhenTheInterruptedReadFailed(t *testing.T) {
	st := &interruptStream{dies: true, reading: make(chan struct{}, 1)}
	sr := newStreamReader(context.Background(), st, 2, time.Hour, false)
	<-st.reading // the confirmation must interrupt a read, not come before it
	sr.confirm(5)
	select {
	case <-sr.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not end on the failed stream")
	}
	if !errors.Is(sr.err, errConnectionLost) {
		t.Fatalf("reader ended with %v, want the stream's failure", sr.err)
	}
	sr.close(context.Background())
	if confirmed, afterDead := st.sent(); len(confirmed) != 0 || len(afterDead) != 0 {
		t.Fatalf("confirmations sent: %v before, %v after the stream failed; want none", confirmed, afterDead)
	}
}
