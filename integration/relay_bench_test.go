package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/saramacontrol"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

const (
	drainEvents = 200_000
	// The stock path drains ~2,000 events/s from a 200k backlog here (its
	// select sorts the whole unconsumed backlog per 100-row batch), so
	// draining all of it would take minutes: it gets the same 200k backlog
	// and is timed over its first 20k events. Its rate only rises as its
	// backlog shrinks, so timing the start is not in our favour.
	stockDrainEvents = 20_000
)

func benchKfake(b *testing.B, partitions int32) []string {
	b.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, core.TopicEvents), kfake.AllowAutoTopicCreation())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c.ListenAddrs()
}

// BenchmarkRelayDrainVsStockForwarder drains a 200,000-event outbox backlog
// to kfake with our relay, and a backlog of the same events with Watermill's
// stock path (watermill-sql subscriber on DefaultPostgreSQLSchema →
// components/forwarder → watermill-kafka publisher), and prints both rates
// and their ratio.
func BenchmarkRelayDrainVsStockForwarder(b *testing.B) {
	ctx := context.Background()
	relayRate := benchRelayDrain(b, ctx, kafkaSink)
	stockRate := benchStockDrain(b, ctx)
	fmt.Printf("relay drain: %d events in backlog, %.0f events/s (kafka sink, batches of %d)\n", drainEvents, relayRate, relay.BatchSizeDefault)
	fmt.Printf("stock forwarder drain: %d events in backlog, first %d forwarded, %.0f events/s\n", drainEvents, stockDrainEvents, stockRate)
	fmt.Printf("relay drain speedup vs stock forwarder: %.1fx\n", relayRate/stockRate)
	b.ReportMetric(relayRate, "relay-events/s")
	b.ReportMetric(stockRate, "stock-events/s")
}

// BenchmarkRelayDrainKgoVsSarama drains the same 200,000-event backlog
// twice, through the Kafka sink (kgo) and through the sarama idempotent
// sink it replaced (saramacontrol), interleaved, and prints both rates and
// their ratio: the price, or gain, of an ACK that can be trusted.
func BenchmarkRelayDrainKgoVsSarama(b *testing.B) {
	ctx := context.Background()
	var kgoRates, saramaRates []float64
	for range 2 {
		kgoRates = append(kgoRates, benchRelayDrain(b, ctx, kafkaSink))
		saramaRates = append(saramaRates, benchRelayDrain(b, ctx, func(brokers []string) (core.Sink, error) { return saramacontrol.New(brokers) }))
	}
	k, s := median(kgoRates), median(saramaRates)
	fmt.Printf("relay drain, kafka sink on kgo: %.0f events/s; sarama idempotent sink (replaced): %.0f events/s; kgo/sarama %.2fx (%d events, 2 runs each, interleaved)\n",
		k, s, k/s, drainEvents)
	b.ReportMetric(k, "kgo-events/s")
	b.ReportMetric(s, "sarama-events/s")
}

func kafkaSink(brokers []string) (core.Sink, error) { return kafka.New(kafka.Config{Brokers: brokers}) }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func benchRelayDrain(b *testing.B, ctx context.Context, newSink func([]string) (core.Sink, error)) float64 {
	_, pool := pgtest.Ledger(b)
	brokers := benchKfake(b, 16)
	if err := relaytest.Fill(ctx, pool, "drain", 2000, drainEvents/2000); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		b.Fatal(err)
	}
	sink, err := newSink(brokers)
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	reg := prometheus.NewRegistry()
	cfg := relay.Settings{Owner: "bench", SinkName: "kafka", Logger: relayQuietLog, Registerer: reg, StatsInterval: time.Minute}
	_, cfg.ExactlyOnce = sink.(relay.FencedSink)
	r := newRelay(b, pool, sink, cfg)
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer r.Stop(ctx)
	wait.For(b, 3*time.Minute, "the relay to drain the backlog", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM outbox_pending LIMIT 1) x`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n == 0
	})
	return drainEvents / time.Since(start).Seconds()
}

// countingPublisher counts what the forwarder published.
type countingPublisher struct {
	message.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.n.Add(int64(len(msgs)))
	return nil
}

func benchStockDrain(b *testing.B, ctx context.Context) float64 {
	_, pool := pgtest.Ledger(b)
	brokers := benchKfake(b, 16)
	logger := watermill.NopLogger{}
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
		SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, logger)
	if err != nil {
		b.Fatal(err)
	}
	const fwdTopic = "forwarder"
	if err := sub.SubscribeInitialize(fwdTopic); err != nil {
		b.Fatal(err)
	}
	// The same events as forwarder envelopes, one writing transaction.
	if _, err := pool.Exec(ctx, `
INSERT INTO "watermill_forwarder" (uuid, payload, metadata, transaction_id)
SELECT '00000000-0000-4000-8000-' || lpad(i::text, 12, '0'),
       json_build_object(
           'destination_topic', $2::text,
           'uuid', '00000000-0000-4000-8000-' || lpad(i::text, 12, '0'),
           'payload', encode(convert_to(format('{"account":"acc-drain-%s","revision":%s,"currency":"EUR","delta":"1"}', i % 2000, i / 2000 + 1), 'UTF8'), 'base64'),
           'metadata', json_build_object('event_id', '00000000-0000-4000-8000-' || lpad(i::text, 12, '0'),
               'kind', 'event', 'type', 'ledger.account.posted', 'aggregate_type', 'account',
               'aggregate_id', 'acc-drain-' || (i % 2000), 'revision', (i / 2000 + 1)::text)),
       '{}'::json, pg_current_xact_id()
FROM generate_series(0, $1::int - 1) AS i`, drainEvents, core.TopicEvents); err != nil {
		b.Fatal(err)
	}
	kpub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{
		Brokers: brokers,
		Marshaler: wmkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get(core.HeaderAggregateID), nil
		}),
	}, logger)
	if err != nil {
		b.Fatal(err)
	}
	pub := &countingPublisher{Publisher: kpub}
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = fwd.Run(runCtx) }()
	wait.For(b, 3*time.Minute, "the stock forwarder to drain", func() bool { return pub.n.Load() >= stockDrainEvents })
	rate := stockDrainEvents / time.Since(start).Seconds()
	cancel()
	_ = fwd.Close()
	<-done
	_ = pub.Close()
	_ = sub.Close()
	return rate
}

// timingFencedSink times the commits of an exactly-once sink: its ACK is
// PublishShard's transaction commit, recorded in times.
type timingFencedSink struct {
	*kafka.ExactlyOnceSink
	times *relaytest.AckTimes
}

func (s timingFencedSink) PublishShard(ctx context.Context, shard int, batch []core.Envelope, ids []int64) error {
	err := s.ExactlyOnceSink.PublishShard(ctx, shard, batch, ids)
	if err == nil {
		s.times.Record(batch)
	}
	return err
}

// BenchmarkRelayCommitToAckLatency posts 1,000 balanced two-line postings
// per second for ten seconds (8 writers, 1,000 accounts) while the relay
// runs with its defaults (LISTEN/NOTIFY wake-ups, a 500 ms fallback poll)
// over the Kafka sink to kfake, and reports the time from a posting's
// commit returning to the sink's ACK of its events.
func BenchmarkRelayCommitToAckLatency(b *testing.B) {
	l := relayCommitToAck(b, false)
	fmt.Printf("relay commit-to-sink-ACK latency at %.0f postings/s (%d postings, %d events, %d failed): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		l.rate, l.postings, l.events, l.failed, ms(l.p50), ms(l.p99), ms(l.max))
	b.ReportMetric(ms(l.p50), "p50-ms")
	b.ReportMetric(ms(l.p99), "p99-ms")
}

// BenchmarkRelayExactlyOnceCost measures what sink.kafka.exactly_once
// costs, side by side in one run: the 200,000-event drain and the
// commit-to-ACK latency at 1,000 postings/s (the ACK being the commit of
// the transaction), with and without it.
func BenchmarkRelayExactlyOnceCost(b *testing.B) {
	ctx := context.Background()
	plainDrain := benchRelayDrain(b, ctx, kafkaSink)
	eoDrain := benchRelayDrain(b, ctx, func(brokers []string) (core.Sink, error) {
		return kafka.NewExactlyOnce(kafka.Config{Brokers: brokers})
	})
	plain, eo := relayCommitToAck(b, false), relayCommitToAck(b, true)
	fmt.Printf("relay exactly-once drain: %.0f events/s, without %.0f events/s (%.2fx); commit-to-ACK at %.0f postings/s: p50 %.1f ms, p99 %.1f ms; without (%.0f postings/s): p50 %.1f ms, p99 %.1f ms (p99 %.2fx)\n",
		eoDrain, plainDrain, eoDrain/plainDrain, eo.rate, ms(eo.p50), ms(eo.p99), plain.rate, ms(plain.p50), ms(plain.p99), ms(eo.p99)/ms(plain.p99))
	b.ReportMetric(eoDrain, "eo-events/s")
	b.ReportMetric(plainDrain, "plain-events/s")
	b.ReportMetric(ms(eo.p99), "eo-p99-ms")
	b.ReportMetric(ms(plain.p99), "plain-p99-ms")
}

// ackLatency is what relayCommitToAck measured.
type ackLatency struct {
	rate             float64
	postings, events int
	failed           int64
	p50, p99, max    time.Duration
}

// relayCommitToAck posts 1,000 balanced two-line postings per second for
// ten seconds (8 writers, 1,000 accounts) while the relay runs with its
// defaults over the Kafka sink (in exactly-once mode if asked) to kfake,
// and returns the times from a posting's commit returning to the sink's
// ACK of its events.
func relayCommitToAck(b *testing.B, exactlyOnce bool) ackLatency {
	const (
		rate     = 1000
		duration = 10 * time.Second
		writers  = 8
		accounts = 1000
	)
	ctx := context.Background()
	_, pool := pgtest.Ledger(b)
	brokers := benchKfake(b, 16)
	var (
		times *relaytest.AckTimes
		sink  core.Sink
	)
	if exactlyOnce {
		ks, err := kafka.NewExactlyOnce(kafka.Config{Brokers: brokers})
		if err != nil {
			b.Fatal(err)
		}
		times = relaytest.NewAckTimes(ks)
		sink = timingFencedSink{ks, times}
	} else {
		ks, err := kafka.New(kafka.Config{Brokers: brokers})
		if err != nil {
			b.Fatal(err)
		}
		times = relaytest.NewAckTimes(ks)
		sink = times
	}
	defer sink.Close()
	r := startRelay(b, pool, sink, relay.Settings{Owner: "bench", SinkName: "kafka", Logger: relayQuietLog, ExactlyOnce: exactlyOnce})
	defer r.Stop(ctx)
	relaytest.MustPost(b, pool, "acc-warmup")

	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		jobs      = make(chan struct{}, rate)
		wg        sync.WaitGroup
		failures  atomic.Int64
	)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				a := fmt.Sprintf("acc-lat-%d", rand.IntN(accounts))
				c := fmt.Sprintf("acc-lat-%d", rand.IntN(accounts))
				if a == c {
					continue
				}
				ps, err := relaytest.Commit(ctx, pool, a, c)
				now := time.Now()
				if err != nil {
					failures.Add(1)
					continue
				}
				mu.Lock()
				for _, p := range ps {
					committed[p.EventID] = now
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	tick := time.NewTicker(time.Second / rate)
	for sent := 0; time.Since(start) < duration; {
		<-tick.C
		select {
		case jobs <- struct{}{}:
			sent++
		default: // writers behind: the achieved rate is reported below
		}
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	lat := times.WaitLatencies(b, committed)
	postings := len(committed) / 2
	return ackLatency{rate: float64(postings) / elapsed.Seconds(), postings: postings, events: len(committed), failed: failures.Load(),
		p50: lat[len(lat)*50/100], p99: lat[len(lat)*99/100], max: lat[len(lat)-1]}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
