package watermillsink_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/watermillsink"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance wraps Watermill's gochannel. Publish blocks until the
// subscriber ACKs, which keeps order (gochannel fans out from goroutines
// otherwise); the subscriber, started before publishing, keeps a log that
// Read serves.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		gc := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
		var (
			mu   sync.Mutex
			cond = sync.NewCond(&mu)
			logs = map[string][]sinktest.Record{}
			wg   sync.WaitGroup
		)
		ctx, cancel := context.WithCancel(context.Background())
		for _, topic := range []string{core.TopicEvents, "commands.payouts"} {
			msgs, err := gc.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for m := range msgs {
					mu.Lock()
					logs[topic] = append(logs[topic], sinktest.Record{Topic: topic, Headers: m.Metadata, Payload: m.Payload})
					cond.Broadcast()
					mu.Unlock()
					m.Ack()
				}
			}()
		}
		s := watermillsink.New(gc)
		t.Cleanup(func() {
			cancel()
			_ = s.Close()
			wg.Wait()
		})
		return sinktest.Harness{
			Sink: s,
			Read: func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
				stop := context.AfterFunc(ctx, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
				defer stop()
				mu.Lock()
				defer mu.Unlock()
				for len(logs[topic]) < n && ctx.Err() == nil {
					cond.Wait()
				}
				return append([]sinktest.Record(nil), logs[topic]...), ctx.Err()
			},
		}
	})
}
