package redisstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/internal/testkit/redistest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// TestBrokerKillsControlVolatile is the negative control of the conformance
// suite's broker-kill case (TestConformance/BrokerKillsLoseNoAck, on a
// durable server): the same kills on a redis-server that keeps nothing on
// disk must show ACKed records absent, or the case could not see a loss.
func TestBrokerKillsControlVolatile(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts redis-server")
	}
	srv := redistest.StartVolatile(t)
	cfg := redisstream.Config{Addr: srv.Addr, StreamPrefix: redistest.Prefix(t, srv.Addr), MaxPayloadBytes: 1 << 20, DialTimeout: 500 * time.Millisecond}
	h := sinktest.Harness{Sink: sinktest.Open(t, redisstream.New, cfg), Read: readNow(cfg), Kill: func(*testing.T) func() { srv.Kill(); return srv.StartAgain }}
	r := sinktest.MeasureKills(t, h, sinktest.KillOptions{Kills: 2})
	if r.Absent == 0 {
		t.Fatalf("no ACKed record lost across %d kills of a server without persistence: the kill case cannot see a loss", r.Kills)
	}
}

// readNow is readFunc for the broker-kill case: one XRANGE reads the whole
// stream, so when it holds fewer than n entries (ACKed ones lost) waiting
// longer cannot bring more.
func readNow(cfg redisstream.Config) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	read := readFunc(cfg)
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return read(ctx, topic, n)
	}
}
