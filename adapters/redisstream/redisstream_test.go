package redisstream_test

import (
	"context"
	"testing"
	"time"

	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/internal/testkit/redistest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the suite against the machine's Redis, except the
// outage check, which needs a server it may crash: a dedicated durable
// redis-server, killed (SIGKILL) and started again on its AOF.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		addr := redistest.SharedAddr()
		var outage, kill func(*testing.T) func()
		switch {
		case testing.Short():
		case t.Name() == "TestConformance/OutageIsRetryable":
			srv := redistest.Start(t)
			addr = srv.Addr
			outage = func(*testing.T) func() { srv.Kill(); return srv.StartAgain }
		case t.Name() == "TestConformance/"+sinktest.KillCase:
			srv := redistest.Start(t)
			addr = srv.Addr
			kill = func(*testing.T) func() { srv.Kill(); return srv.StartAgain }
		}
		cfg := redisstream.Config{Addr: addr, StreamPrefix: redistest.Prefix(t, addr), MaxPayloadBytes: 1 << 20, DialTimeout: 500 * time.Millisecond}
		h := sinktest.Harness{Sink: sinktest.Open(t, redisstream.New, cfg), Read: readFunc(cfg), TooLarge: make([]byte, 2<<20), Outage: outage, Kill: kill}
		if kill != nil {
			h.Read = readNow(cfg) // kills_test.go
		}
		return h
	})
}

// readFunc reads a topic's stream from its first entry with XRANGE,
// decoding with watermill-redisstream's unmarshaller.
func readFunc(cfg redisstream.Config) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		c := cfg.Client()
		defer c.Close()
		var xs []redis.XMessage
		for {
			got, err := c.XRange(ctx, cfg.Stream(topic), "-", "+").Result()
			if err != nil && err != redis.Nil {
				if ctx.Err() != nil {
					break // return what the last read had
				}
				return nil, err
			}
			xs = got
			if len(xs) >= n {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			if ctx.Err() != nil {
				break
			}
		}
		var out []sinktest.Record
		for _, x := range xs {
			msg, err := wmredis.DefaultMarshallerUnmarshaller{}.Unmarshal(x.Values)
			if err != nil {
				return out, err
			}
			out = append(out, sinktest.MessageRecord(topic, msg))
		}
		if len(out) < n {
			return out, ctx.Err()
		}
		return out, nil
	}
}
