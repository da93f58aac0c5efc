package memory_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		s := memory.New(memory.Config{MaxPayloadBytes: 1 << 20})
		t.Cleanup(func() { _ = s.Close() })
		return sinktest.Harness{
			Sink:     s,
			Read:     ReadFunc(s),
			TooLarge: make([]byte, 2<<20),
			Outage: func(t *testing.T) func() {
				s.SetDown(true)
				return func() { s.SetDown(false) }
			},
		}
	})
}

// ReadFunc reads back from the gochannel through a fresh subscription;
// persistent mode replays everything published so far.
func ReadFunc(s *memory.Sink) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		msgs, err := s.Subscriber().Subscribe(ctx, topic)
		if err != nil {
			return nil, err
		}
		var out []sinktest.Record
		for len(out) < n {
			select {
			case <-ctx.Done():
				return out, ctx.Err()
			case m, ok := <-msgs:
				if !ok {
					return out, context.Canceled
				}
				out = append(out, sinktest.Record{Topic: topic, Headers: m.Metadata, Payload: m.Payload})
				m.Ack()
			}
		}
		return out, nil
	}
}
