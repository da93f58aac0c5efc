package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay/polling"
)

var relayQuietLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// relayBroker is a kfake broker over real sockets that can be stopped and
// started again on the same port and data directory (a broker restart).
type relayBroker struct {
	t       *testing.T
	opts    []kfake.Opt
	cluster *kfake.Cluster
	addrs   []string
}

func startRelayBroker(t *testing.T) *relayBroker {
	t.Helper()
	b := &relayBroker{t: t, opts: []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(4, core.TopicEvents),
		kfake.AllowAutoTopicCreation(),
		kfake.DataDir(t.TempDir()),
	}}
	c, err := kfake.NewCluster(b.opts...)
	if err != nil {
		t.Fatal(err)
	}
	b.cluster, b.addrs = c, c.ListenAddrs()
	t.Cleanup(func() { b.cluster.Close() })
	return b
}

func (b *relayBroker) stop() { b.cluster.Close() }

func (b *relayBroker) restart() {
	_, p, _ := net.SplitHostPort(b.addrs[0])
	port, _ := strconv.Atoi(p)
	c, err := kfake.NewCluster(append(b.opts, kfake.Ports(port))...)
	if err != nil {
		b.t.Fatalf("restart kfake on %s: %v", b.addrs[0], err)
	}
	b.cluster = c
}

// records reads ledger.events from the start with franz-go (which shows
// the record key) until n records or d passes.
// reader consumes the events topic from its start.
func (b *relayBroker) reader() *kgo.Client {
	b.t.Helper()
	return eventsReader(b.t, b.addrs)
}

// eventsReader consumes the events topic of brokers from its start.
func eventsReader(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(core.TopicEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func (b *relayBroker) records(n int, d time.Duration) []*kgo.Record {
	b.t.Helper()
	cl := b.reader()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// recordsHolding reads the topic from the start until every one of
// eventIDs has been seen (or d passes) and returns all records read,
// repeats included: after crashes and outages the log holds resends, so a
// count of records says nothing about which events are there.
func (b *relayBroker) recordsHolding(eventIDs []string, d time.Duration) []*kgo.Record {
	b.t.Helper()
	cl := b.reader()
	defer cl.Close()
	missing := make(map[string]bool, len(eventIDs))
	for _, id := range eventIDs {
		missing[id] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []*kgo.Record
	for len(missing) > 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			delete(missing, headers(r)[core.HeaderEventID])
		})
	}
	return out
}

func startKafkaRelay(t *testing.T, pool *pgxpool.Pool, brokers []string, owner string) (*polling.Relay, *prometheus.Registry) {
	t.Helper()
	return startTestRelay(t, pool, newKafkaSink(t, brokers), owner, "kafka")
}

// newKafkaSink is the Kafka sink on brokers with the test relays' short
// dial and retry timings.
func newKafkaSink(t *testing.T, brokers []string) *kafka.Sink {
	t.Helper()
	return sinktest.Open(t, kafka.New, kafka.Config{Brokers: brokers, ClientOpts: testKafkaOpts()})
}

// testKafkaOpts are the test relays' Kafka client timings: a dead broker
// is noticed within a second and retried every 50 ms.
func testKafkaOpts() []kgo.Opt {
	return []kgo.Opt{kgo.DialTimeout(time.Second), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond })}
}

// TestRelayToKafkaReadByWatermillSubscriber: every committed event reaches
// Kafka keyed by account, in revision order per account, and watermill-kafka's
// own subscriber reads the records with their event IDs and headers.
func TestRelayToKafkaReadByWatermillSubscriber(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	b := startRelayBroker(t)
	posted := relaytest.MustPostTransfers(t, pool, 100, 9, 4)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { // rolled back: never sent
		_, err := relaytest.Post(ctx, tx, "acc-rolled-back")
		if err == nil {
			err = fmt.Errorf("roll back")
		}
		return err
	}); err == nil {
		t.Fatal("expected rollback")
	}
	startKafkaRelay(t, pool, b.addrs, "relay-k")
	recs := b.records(len(posted), 20*time.Second)
	if len(recs) != len(posted) {
		t.Fatalf("kafka has %d records, want %d", len(recs), len(posted))
	}
	last := map[string]int64{}
	for _, r := range recs {
		e, err := core.EnvelopeFromHeaders(headers(r), r.Value)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Key) != e.AggregateID || e.AggregateID == "acc-rolled-back" {
			t.Fatalf("record key %q for %s", r.Key, e.AggregateID)
		}
		if e.Revision != last[e.AggregateID]+1 {
			t.Fatalf("%s: revision %d after %d", e.AggregateID, e.Revision, last[e.AggregateID])
		}
		last[e.AggregateID] = e.Revision
	}

	// watermill-kafka's subscriber (what consumers run) reads the same records.
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers: b.addrs, Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: "relay-test",
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(sctx, core.TopicEvents)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, p := range posted {
		want[p.EventID] = true
	}
	for len(want) > 0 {
		select {
		case m := <-msgs:
			e, err := core.EnvelopeFromMessage(m)
			if err != nil || m.UUID != e.EventID {
				t.Fatalf("watermill message %s: %+v %v", m.UUID, e, err)
			}
			delete(want, e.EventID)
			m.Ack()
		case <-sctx.Done():
			t.Fatalf("watermill subscriber: %d events missing", len(want))
		}
	}
}

// TestRelayKafkaOutageAndRecovery closes the broker while the relay runs and
// starts it again on the same port: the relay retries with backoff, the
// backlog grows, nothing is lost, delivery resumes by itself.
func TestRelayKafkaOutageAndRecovery(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	b := startRelayBroker(t)
	_, reg := startKafkaRelay(t, pool, b.addrs, "relay-outage")
	first := relaytest.MustPost(t, pool, "acc-1", "acc-2")
	if n := len(b.records(len(first), 20*time.Second)); n != len(first) {
		t.Fatalf("before the outage: %d records", n)
	}
	wait.For(t, 10*time.Second, "markers", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	b.stop()
	posted := relaytest.MustPostN(t, pool, 40, 6)
	wait.For(t, 20*time.Second, "retries during the outage", func() bool {
		return promtest.Value(t, reg, "posthorn_relay_retries_total") >= 2
	})
	if n := relaytest.Unrelayed(t, pool); n != len(posted) {
		t.Fatalf("during the outage %d rows unrelayed, want %d (nothing marked without an ACK)", n, len(posted))
	}
	wait.For(t, 5*time.Second, "backlog gauge", func() bool {
		return promtest.Value(t, reg, "posthorn_outbox_backlog_events") == float64(len(posted))
	})
	b.restart()
	wait.For(t, 60*time.Second, "delivery to resume", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	recs := b.records(len(first)+len(posted), 20*time.Second)
	ids := map[string]bool{}
	last := map[string]int64{}
	for _, r := range recs {
		h := headers(r)
		id, agg := h[core.HeaderEventID], h[core.HeaderAggregateID]
		rev, _ := strconv.ParseInt(h[core.HeaderRevision], 10, 64)
		ids[id] = true
		if rev > last[agg]+1 {
			t.Fatalf("%s: revision %d after %d (gap)", agg, rev, last[agg])
		}
		last[agg] = max(last[agg], rev)
	}
	for _, p := range append(first, posted...) {
		if !ids[p.EventID] {
			t.Fatalf("event %s lost across the outage", p.EventID)
		}
	}
}

// TestRelayKafkaRecordTooLargeParksOnlyItsAccount: Kafka refuses a record
// over its size limit for good; the account is parked and the others flow,
// with and without exactly-once.
func TestRelayKafkaRecordTooLargeParksOnlyItsAccount(t *testing.T) {
	t.Parallel()
	for _, exactlyOnce := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once %v", exactlyOnce), func(t *testing.T) {
			t.Parallel()
			recordTooLargeParksOnlyItsAccount(t, exactlyOnce)
		})
	}
}

func recordTooLargeParksOnlyItsAccount(t *testing.T, exactlyOnce bool) {
	_, pool := pgtest.Ledger(t)
	b := startRelayBroker(t)
	ctx := context.Background()
	relaytest.MustPostPayload(t, pool, "acc-huge", make([]byte, 2<<20))
	relaytest.MustPost(t, pool, "acc-huge")
	good := relaytest.MustPostN(t, pool, 30, 5)
	var reg *prometheus.Registry
	if exactlyOnce {
		_, reg = startTestRelay(t, pool, newExactlyOnceSink(t, b.addrs), "relay-park", "kafka")
	} else {
		_, reg = startKafkaRelay(t, pool, b.addrs, "relay-park")
	}
	wait.For(t, 20*time.Second, "the good accounts delivered", func() bool { return relaytest.Unrelayed(t, pool) == 2 })
	wait.For(t, 5*time.Second, "parked gauge", func() bool {
		return promtest.Value(t, reg, "posthorn_relay_parked_aggregates") == 1
	})
	for _, r := range b.records(len(good), 20*time.Second) {
		if string(r.Key) == "acc-huge" {
			t.Fatalf("a record of the parked account reached Kafka")
		}
	}
	st, err := relaystore.New(pool).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Parked) != 1 || st.Parked[0].AggregateID != "acc-huge" {
		t.Fatalf("parked: %+v", st.Parked)
	}
}

// TestRelayKafkaTopicReadByKcat: an independent Kafka client (kcat, on
// librdkafka) reads what the relay wrote: every event ID is there with the
// contract's headers, keyed by account, and each key sits on the Java
// client's partition, (murmur2(key) & 0x7fffffff) % partitions.
func TestRelayKafkaTopicReadByKcat(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (Debian package kcat; .ci/run installs it)")
	}
	_, pool := pgtest.Ledger(t)
	b := startRelayBroker(t) // 4 partitions
	posted := relaytest.MustPostTransfers(t, pool, 150, 37, 5)
	startKafkaRelay(t, pool, b.addrs, "relay-kcat")
	if got := b.recordsHolding(eventIDs(posted), 30*time.Second); len(got) < len(posted) {
		t.Fatalf("the relay wrote %d of %d records", len(got), len(posted))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kcat, "-C", "-b", b.addrs[0], "-t", core.TopicEvents, "-o", "beginning", "-e", "-q",
		"-f", `%p\t%k\t%h\t%s\n`).CombinedOutput()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	want := map[string]relaytest.Posted{}
	for _, p := range posted {
		want[p.EventID] = p
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 4)
		if len(f) != 4 {
			t.Fatalf("kcat line %q", line)
		}
		h := kcatHeaders(f[2])
		e, err := core.EnvelopeFromHeaders(h, []byte(f[3]))
		if err != nil {
			t.Fatalf("kcat record %q: %v", line, err)
		}
		p, ok := want[e.EventID]
		if !ok {
			t.Fatalf("kcat read event %s that was never posted", e.EventID)
		}
		if e.AggregateID != p.Account || e.Revision != p.Revision || f[1] != p.Account || h[wmkafka.UUIDHeaderKey] != e.EventID {
			t.Fatalf("kcat record %q: want key %s revision %d", line, p.Account, p.Revision)
		}
		for _, name := range []string{core.HeaderKind, core.HeaderType, core.HeaderAggregateType, core.HeaderJournalID, core.HeaderOccurredAt} {
			if _, ok := h[name]; !ok {
				t.Fatalf("kcat record %q has no %s header", line, name)
			}
		}
		if h[core.HeaderKind] != string(core.KindEvent) || h[core.HeaderType] != core.TypeAccountPosted || h[core.HeaderAggregateType] != core.AggregateAccount {
			t.Fatalf("kcat record %q: kind, type or aggregate_type wrong", line)
		}
		if _, err := time.Parse(time.RFC3339Nano, h[core.HeaderOccurredAt]); err != nil {
			t.Fatalf("occurred_at %q is not RFC 3339", h[core.HeaderOccurredAt])
		}
		part, _ := strconv.Atoi(f[0])
		if wantPart := kafkatest.JavaPartition(f[1], 4); part != wantPart {
			t.Fatalf("key %s on partition %d, the Java client's partitioner says %d", f[1], part, wantPart)
		}
		seen[e.EventID] = true
	}
	if len(seen) != len(want) {
		t.Fatalf("kcat read %d of %d events", len(seen), len(want))
	}
}

// kcatHeaders parses kcat's %h: key=value pairs separated by commas (no
// header value of ours holds either).
func kcatHeaders(s string) map[string]string {
	h := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		h[k] = v
	}
	return h
}

func eventIDs(posted []relaytest.Posted) []string {
	ids := make([]string, len(posted))
	for i, p := range posted {
		ids[i] = p.EventID
	}
	return ids
}
