package consumers

import (
	"context"
	"testing"
	"time"
)

// A message waits for the messages delivered before it to pass, and no
// longer than handOffWait for one that never comes; a waiter whose context
// ends stops waiting. The negative control: the one waiting for a missing
// predecessor is not let through before handOffWait.
func TestHandOffOrdersAndExpires(t *testing.T) {
	h := newHandOff()
	ctx := context.Background()
	released := make(chan uint64, 8)
	for _, seq := range []uint64{2, 1} {
		go func() {
			h.wait(ctx, seq)
			released <- seq
			h.pass(seq)
		}()
	}
	select {
	case seq := <-released:
		t.Fatalf("message %d went through before message 0 passed", seq)
	case <-time.After(50 * time.Millisecond):
	}
	h.pass(0)
	for _, want := range []uint64{1, 2} {
		if got := <-released; got != want {
			t.Fatalf("released %d, want %d (delivery order)", got, want)
		}
	}

	// Message 3 never comes: 4 waits for it handOffWait, then goes.
	start := time.Now()
	go func() {
		h.wait(ctx, 4)
		released <- 4
	}()
	select {
	case <-released:
		t.Fatalf("message 4 went through after %s, before handOffWait", time.Since(start))
	case <-time.After(handOffWait / 2):
	}
	if got := <-released; got != 4 || time.Since(start) < handOffWait {
		t.Fatalf("released %d after %s, want 4 after %s", got, time.Since(start), handOffWait)
	}

	// A waiter whose context ends returns at once.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		h.wait(cctx, 9)
		released <- 9
	}()
	cancel()
	select {
	case got := <-released:
		if got != 9 {
			t.Fatalf("released %d, want 9", got)
		}
	case <-time.After(handOffWait / 2):
		t.Fatal("a waiter whose context ended still waits")
	}
}
