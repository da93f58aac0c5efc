package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// The consumer benchmark's backlog: the 10,000 postings' worth of
// events (20,000), over 2,000 accounts, on the dev broker's partition count.
const (
	consumerBenchAccounts   = 2000
	consumerBenchPerAccount = 10
	consumerBenchEvents     = consumerBenchAccounts * consumerBenchPerAccount
)

// BenchmarkConsumerApply relays one backlog of ledger.account.posted
// events to kfake, then reads that same topic from the start, each run in
// a consumer group and a consumer database of its own:
//
//   - both example consumers with the inbox in one process (what `posthorn
//     consume` runs);
//   - balance-projection alone with the inbox, and alone as it ran before
//     batching (watermill-kafka's subscriber, a transaction per event);
//   - a plain Watermill router handler that writes the projection's effect
//     without the inbox, each event in its own transaction: on the same
//     subscriber as the consumers, and on watermill-kafka's stock one.
//
// A rate is the backlog divided by the time from the run's first applied
// event to its last (the group join before it is not counted; the
// recovery benchmark measures that). The overhead is the plain handler's
// rate over balance-projection's alone.
func BenchmarkConsumerApply(b *testing.B) {
	ctx := context.Background()
	brokers := benchKfake(b, kfakebroker.DefaultPartitions)
	relayBacklog(b, ctx, brokers, "capply", consumerBenchAccounts, consumerBenchPerAccount)

	ours := func(group string) (message.Subscriber, error) {
		return kafkagroup.Subscriber(brokers, group, nil)
	}
	stockSub := func(group string) (message.Subscriber, error) {
		return wmkafka.NewSubscriber(wmkafka.SubscriberConfig{Brokers: brokers, Unmarshaler: wmkafka.DefaultMarshaler{},
			OverwriteSaramaConfig: kafkagroup.SaramaConfig(), ConsumerGroup: group}, watermill.NopLogger{})
	}
	both := benchConsumers(b, ctx, "both", []string{projection.Name, auditlog.Name}, consumerBenchEvents, benchRun{subscriber: ours})
	alone := benchConsumers(b, ctx, "alone", []string{projection.Name}, consumerBenchEvents, benchRun{subscriber: ours})
	// The consumer as it was before batching: watermill-kafka's subscriber
	// (one message in flight per partition) and a transaction per event.
	before := benchConsumers(b, ctx, "before", []string{projection.Name}, consumerBenchEvents,
		benchRun{subscriber: stockSub, maxBatch: 1, perEvent: true})
	plain := benchPlainHandler(b, ctx, "same", consumerBenchEvents, ours)
	stock := benchPlainHandler(b, ctx, "stock", consumerBenchEvents, stockSub)

	p := alone[projection.Name]
	fmt.Printf("consumer apply rate: %.0f events/s, plain handler %.0f events/s, inbox overhead %.1fx\n", p, plain, plain/p)
	fmt.Printf("consumer apply rate before batching (watermill-kafka subscriber, a transaction per event): %.0f events/s; now %.1fx that\n", before[projection.Name], p/before[projection.Name])
	fmt.Printf("consumer plain handler on watermill-kafka's subscriber (the stock path): %.0f events/s; balance-projection with the inbox %.1fx that\n", stock, p/stock)
	fmt.Printf("consumer apply rate, both example consumers in one process (%d-event backlog, %d partitions): %s %.0f events/s, %s %.0f events/s\n",
		consumerBenchEvents, kfakebroker.DefaultPartitions, projection.Name, both[projection.Name], auditlog.Name, both[auditlog.Name])
	b.ReportMetric(alone[projection.Name], "inbox-events/s")
	b.ReportMetric(plain, "plain-events/s")
}

// relayBacklog writes accounts×perAccount events to the outbox and relays
// them to the brokers' ledger.events with the relay's Kafka sink, so the
// consumers read exactly what `posthorn relay` writes.
func relayBacklog(b *testing.B, ctx context.Context, brokers []string, prefix string, accounts, perAccount int) {
	b.Helper()
	_, pool := pgtest.Ledger(b)
	if err := relaytest.Fill(ctx, pool, prefix, accounts, perAccount); err != nil {
		b.Fatal(err)
	}
	sink, err := kafka.New(kafka.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	r := startRelay(b, pool, sink, relay.Settings{
		Owner: "bench", SinkName: "kafka", Logger: relayQuietLog, Registerer: prometheus.NewRegistry(), StatsInterval: time.Minute,
	})
	defer r.Stop(ctx)
	wait.For(b, 3*time.Minute, "the relay to drain the backlog", func() bool { return relaytest.Unrelayed(b, pool) == 0 })
}

// benchPool is the consumer database as `posthorn consume` opens it.
func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	url, _ := pgtest.Consumer(b)
	return pgtest.Pool(b, url, 8)
}

// benchRun is how benchConsumers reads and applies.
type benchRun struct {
	subscriber func(group string) (message.Subscriber, error)
	maxBatch   int  // consumers.Config.MaxBatch
	perEvent   bool // no BatchHandler: the handler's statement per event
}

// benchConsumers runs the named example consumers with the inbox until each
// has applied events, and returns each one's rate.
func benchConsumers(b *testing.B, ctx context.Context, run string, names []string, events int, how benchRun) map[string]float64 {
	b.Helper()
	pool := benchPool(b)
	reg := newRegistry(b, pool, 30*time.Second, consumers.Config{
		Subscribers: func(consumer string) (message.Subscriber, error) {
			return how.subscriber(consumer + "-bench-" + run)
		},
		Logger:   relayQuietLog,
		MaxBatch: how.maxBatch,
	})
	clocks := map[string]*relaytest.ApplyClock{}
	for _, n := range names {
		c := &relaytest.ApplyClock{}
		clocks[n] = c
		h := map[string]consumers.Handler{projection.Name: projection.Handle, auditlog.Name: auditlog.Handle}[n]
		timed := func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
			if err := h(ctx, tx, e); err != nil {
				return err
			}
			c.Tick(1)
			return nil
		}
		bh := map[string]consumers.BatchHandler{projection.Name: projection.HandleBatch, auditlog.Name: auditlog.HandleBatch}[n]
		timedBatch := func(ctx context.Context, tx pgx.Tx, es []core.Envelope) error {
			if err := bh(ctx, tx, es); err != nil {
				return err
			}
			c.Tick(len(es))
			return nil
		}
		var opts []consumers.Option
		if !how.perEvent {
			opts = append(opts, consumers.WithBatchHandler(timedBatch))
		}
		if n == projection.Name {
			opts = append(opts, consumers.DependsOnPredecessor())
		}
		if err := reg.AddEventHandler(n, core.TopicEvents, timed, opts...); err != nil {
			b.Fatal(err)
		}
	}
	stop, _ := runInBackground(b, ctx, reg.Run, b.Errorf)
	defer stop()
	// The inbox is asked only once the handlers have seen every event:
	// its count groups the whole inbox, and asked every 10 ms during the
	// run it took up to 0.7 of a core from the consumer it measures.
	wait.For(b, 5*time.Minute, run+": every event applied by every consumer", func() bool {
		for _, n := range names {
			if !clocks[n].Reached(events) {
				return false
			}
			c, err := inboxstore.New(pool).Count(ctx, n)
			if err != nil {
				b.Fatal(err)
			}
			if c.Events[core.DispositionApplied] < int64(events) {
				return false
			}
		}
		return true
	})
	rates := map[string]float64{}
	for n, c := range clocks {
		rates[n] = float64(events) / c.Span().Seconds()
	}
	return rates
}

// benchPlainHandler is the baseline: a Watermill router handler that
// writes balance-projection's effect in a transaction of its own per event,
// with no inbox, read with the given subscriber: the consumers' own
// (KafkaSubscriber, the inbox's cost alone) or watermill-kafka's (the
// stock path a team would write).
func benchPlainHandler(b *testing.B, ctx context.Context, run string, events int, subscriber func(group string) (message.Subscriber, error)) float64 {
	b.Helper()
	pool := benchPool(b)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	sub, err := closedAtCleanup(b, subscriber)("plain-bench-" + run)
	if err != nil {
		b.Fatal(err)
	}
	var clock relaytest.ApplyClock
	router.AddConsumerHandler("plain", core.TopicEvents, sub, func(msg *message.Message) error {
		e, err := core.EnvelopeFromMessage(msg)
		if err != nil {
			return err
		}
		if err := pgx.BeginFunc(msg.Context(), pool, func(tx pgx.Tx) error { return projection.Handle(msg.Context(), tx, e) }); err != nil {
			return err
		}
		clock.Tick(1)
		return nil
	})
	stop, _ := runInBackground(b, ctx, router.Run, b.Errorf)
	defer stop()
	wait.For(b, 5*time.Minute, "the plain handler to apply every event", func() bool { return clock.Reached(events) })
	return float64(events) / clock.Span().Seconds()
}
