package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/amqptest"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/redistest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

const sinkDrainEvents = 100_000

// BenchmarkSinksDrain drains a 100,000-event outbox backlog (1,000
// accounts × 100 revisions, written by INSERT … SELECT generate_series) with
// the relay's defaults through every sink, one after the other in one run,
// and prints events/s side by side: Kafka on kfake (in-process, real
// sockets), then NATS JetStream, RabbitMQ, Redis Streams and Postgres on
// this machine's servers. The clock runs from the relay's start to the
// last marker, so it includes every broker ACK.
func BenchmarkSinksDrain(b *testing.B) {
	kinds := []string{"kafka", "nats", "amqp", "redis", "postgres"}
	rates, sinkRates := map[string]float64{}, map[string]float64{}
	loadBefore := loadAvg()
	for _, kind := range kinds {
		rates[kind], sinkRates[kind] = benchSinkDrain(b, kind)
	}
	// The machine is shared: a busy one slows every sink, so say how busy.
	fmt.Printf("relay drain of a %d-event backlog, batches of %d, one run (load average %s before, %s after):\n",
		sinkDrainEvents, relay.BatchSizeDefault, loadBefore, loadAvg())
	for _, kind := range kinds {
		fmt.Printf("  %-8s %8.0f events/s drained; inside Publish alone %8.0f events/s\n", kind, rates[kind], sinkRates[kind])
		b.ReportMetric(rates[kind], kind+"-events/s")
	}
}

// loadAvg is the one-minute load average, or "?" where /proc is missing.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// publishClock adds up the time spent inside the sink's Publish, so the
// sink's own cost is seen apart from the relay's reads and markers.
type publishClock struct {
	core.Sink
	mu    sync.Mutex
	spent time.Duration
	acked int
}

func (c *publishClock) Publish(ctx context.Context, batch []core.Envelope) error {
	start := time.Now()
	err := c.Sink.Publish(ctx, batch)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spent += time.Since(start)
	if err == nil {
		c.acked += len(batch)
	}
	return err
}

// benchSinkDrain returns the drain rate and the rate inside Publish alone.
func benchSinkDrain(b *testing.B, kind string) (drain, publish float64) {
	ctx := context.Background()
	_, pool := pgtest.Ledger(b)
	if err := relaytest.Fill(ctx, pool, "drain", 1000, sinkDrainEvents/1000); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		b.Fatal(err)
	}
	var (
		sink core.Sink
		err  error
	)
	sc := brokers.Config{}
	sc.Kind = kind
	switch kind {
	case "kafka":
		sink, err = kafka.New(kafka.Config{Brokers: benchKfake(b, 16)})
	case "nats":
		sc.NATS.URL = natstest.SharedURL()
		sc.NATS.SubjectPrefix = natstest.Prefix(b, sc.NATS.URL)
	case "amqp":
		sc.AMQP.URL = amqptest.SharedURL()
		sc.AMQP.Consumers = []string{"bench"}
		sc.AMQP.ExchangePrefix = amqptest.Prefix(b, sc.AMQP.URL, []string{core.TopicEvents}, sc.AMQP.Consumers)
	case "redis":
		sc.Redis.Addr = redistest.SharedAddr()
		sc.Redis.StreamPrefix = redistest.Prefix(b, sc.Redis.Addr)
	case "postgres":
		sc.Postgres.URL = pgtest.NewDatabase(b)
	}
	if sink == nil && err == nil {
		sink, err = brokers.OpenSink(sc)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	clock := &publishClock{Sink: sink}
	r := newRelay(b, pool, clock, relay.Settings{
		Owner: "bench-" + kind, SinkName: kind, Logger: relayQuietLog, Registerer: prometheus.NewRegistry(), StatsInterval: time.Minute,
	})
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = r.Stop(ctx)
		}
	}()
	wait.For(b, 3*time.Minute, kind+": the relay to drain the backlog", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM outbox_pending LIMIT 1) x`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n == 0
	})
	drain = sinkDrainEvents / time.Since(start).Seconds()
	stopped = true
	if err := r.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	clock.mu.Lock()
	defer clock.mu.Unlock()
	return drain, float64(clock.acked) / clock.spent.Seconds()
}
