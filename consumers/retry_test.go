package consumers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// A failing handler is retried up to MaxRetries times, each wait the
// exponential backoff's (InitialInterval, then times Multiplier, capped at
// MaxInterval); it stops at the first success, at once for an error
// shouldRetry refuses, and when the message's context ends.
func TestRetryingAttemptsAndWaits(t *testing.T) {
	r := middleware.Retry{MaxRetries: 3, InitialInterval: 20 * time.Millisecond, Multiplier: 2, MaxInterval: 50 * time.Millisecond}
	transient, permanent := errors.New("transient"), errors.New("permanent")
	shouldRetry := func(err error) bool { return !errors.Is(err, permanent) }
	for _, c := range []struct {
		name     string
		failures int   // attempts that fail before one succeeds
		err      error // what they fail with
		attempts int
		wantErr  error
		minWait  time.Duration // at least the backoff's waits
	}{
		{"succeeds at once", 0, transient, 1, nil, 0},
		{"succeeds on the third attempt", 2, transient, 3, nil, 60 * time.Millisecond},
		{"fails every attempt", 10, transient, 4, transient, 110 * time.Millisecond}, // 20 + 40 + 50 (capped)
		{"permanent", 10, permanent, 1, permanent, 0},
	} {
		attempts := 0
		h := retrying(r, shouldRetry)(func(*message.Message) ([]*message.Message, error) {
			attempts++
			if attempts <= c.failures {
				return nil, c.err
			}
			return nil, nil
		})
		start := time.Now()
		_, err := h(message.NewMessage("m", nil))
		took := time.Since(start)
		if attempts != c.attempts || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
			t.Errorf("%s: %d attempts, error %v; want %d, %v", c.name, attempts, err, c.attempts, c.wantErr)
		}
		if took < c.minWait {
			t.Errorf("%s: took %s, want at least the backoff's %s", c.name, took, c.minWait)
		}
	}
	// A message whose context ends stops waiting.
	msg := message.NewMessage("m", nil)
	ctx, cancel := context.WithCancel(context.Background())
	msg.SetContext(ctx)
	attempts := 0
	h := retrying(middleware.Retry{MaxRetries: 5, InitialInterval: time.Hour, Multiplier: 2, MaxInterval: time.Hour}, shouldRetry)(
		func(*message.Message) ([]*message.Message, error) {
			attempts++
			cancel()
			return nil, transient
		})
	if _, err := h(msg); !errors.Is(err, context.Canceled) || attempts != 1 {
		t.Errorf("cancelled: %d attempts, error %v; want 1 and context.Canceled", attempts, err)
	}
}

// BenchmarkRetryingSucceeds: a message that succeeds at once costs no
// allocation in the retry middleware; Watermill's Retry middleware as the
// baseline.
func BenchmarkRetryingSucceeds(b *testing.B) {
	r := middleware.Retry{MaxRetries: 5, InitialInterval: time.Millisecond, Multiplier: 2, MaxInterval: time.Second,
		ShouldRetry: func(middleware.RetryParams) bool { return true }}
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	msg := message.NewMessage("m", nil)
	for _, c := range []struct {
		name string
		h    message.HandlerFunc
	}{
		{"watermill", r.Middleware(ok)},
		{"consumers", retrying(r, func(error) bool { return true })(ok)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = c.h(msg)
			}
		})
	}
}
