package sinkgate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/internal/sinkgate"
	"github.com/posthorn/posthorn/core"
)

var errClosed = errors.New("test sink closed")

func TestGatePreamble(t *testing.T) {
	t.Parallel()
	g := &sinkgate.Gate{Closed: errClosed}
	batch := []core.Envelope{{EventID: "e1"}}
	called := 0
	publish := func(context.Context, []core.Envelope) error { called++; return nil }
	if err := g.Publish(context.Background(), nil, publish); err != nil || called != 0 {
		t.Fatalf("empty batch: %v, publish called %d times", err, called)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Publish(ctx, batch, publish); !errors.Is(err, context.Canceled) || called != 0 {
		t.Fatalf("done context: %v, publish called %d times", err, called)
	}
	if err := g.Publish(context.Background(), batch, publish); err != nil || called != 1 {
		t.Fatalf("open gate: %v, publish called %d times", err, called)
	}
	released := 0
	release := func() error { released++; return nil }
	if err := g.Close(release); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(release); err != nil || released != 1 {
		t.Fatalf("second Close: %v, released %d times", err, released)
	}
	if err := g.Publish(context.Background(), batch, publish); !errors.Is(err, errClosed) || called != 1 {
		t.Fatalf("after Close: %v, publish called %d times", err, called)
	}
}

// TestGateCloseWaitsForPublish: the connection is not released under a
// batch still using it.
func TestGateCloseWaitsForPublish(t *testing.T) {
	t.Parallel()
	for _, serial := range []bool{false, true} {
		g := &sinkgate.Gate{Closed: errClosed, Serial: serial}
		inPublish, finish := make(chan struct{}), make(chan struct{})
		published := make(chan error, 1)
		go func() {
			published <- g.Publish(context.Background(), []core.Envelope{{EventID: "e1"}}, func(context.Context, []core.Envelope) error {
				close(inPublish)
				<-finish
				return nil
			})
		}()
		<-inPublish
		closed := make(chan struct{})
		go func() {
			_ = g.Close(func() error { return nil })
			close(closed)
		}()
		// A Close that does not wait returns at once; one that waits cannot
		// return before finish, however long this waits.
		select {
		case <-closed:
			t.Fatalf("serial %v: Close returned while Publish was running", serial)
		case <-time.After(50 * time.Millisecond):
		}
		close(finish)
		if err := <-published; err != nil {
			t.Fatal(err)
		}
		<-closed
	}
}
