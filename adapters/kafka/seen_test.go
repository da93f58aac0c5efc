package kafka_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// TestTopicSeenApacheKafka: the failover check's reader of the sink, on
// Apache Kafka, returns exactly the committed Posthorn records written
// since its bound, whole: not those older than the bound, not those of an
// aborted transaction, not a record without the contract headers; and it
// ends although the partitions end on transaction markers, which no
// record reaches.
func TestTopicSeenApacheKafka(t *testing.T) {
	c := apacheCluster(t)
	topic := topicPrefix() + core.TopicEvents
	createTopics(t, c.Brokers, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.TransactionalID("seen-test-"+topic), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	record := func(id string, rev int64, at time.Time) *kgo.Record {
		e := core.Envelope{EventID: id, Kind: core.KindEvent, Type: core.TypeAccountPosted, AggregateType: core.AggregateAccount,
			AggregateID: fmt.Sprintf("acc-%d", rev%3), Revision: rev, JournalID: "j-" + id, OccurredAt: at,
			Payload: []byte(`{"event_id":"` + id + `"}`)}
		r := &kgo.Record{Key: []byte(e.AggregateID), Value: e.Payload, Timestamp: at}
		for k, v := range e.WireHeaders() {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		return r
	}
	transaction := func(commit bool, recs ...*kgo.Record) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	since := time.Now().Add(-time.Hour)
	transaction(true, record("old-1", 1, old), record("old-2", 2, old))
	var want []string
	var recent []*kgo.Record
	for i := range 30 {
		id := fmt.Sprintf("new-%02d", i)
		want = append(want, id)
		recent = append(recent, record(id, int64(10+i), time.Now()))
	}
	transaction(true, recent[:15]...)
	transaction(false, record("aborted-1", 100, time.Now()), record("aborted-2", 101, time.Now()))
	transaction(true, append(recent[15:], &kgo.Record{Value: []byte("not Posthorn's"), Timestamp: time.Now()})...)

	began := time.Now()
	seen, err := readSeen(ctx, kafka.TopicSeen{Config: kafka.Config{Brokers: c.Brokers}, Topics: []string{topic}, Since: since})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range seen {
		got = append(got, e.EventID)
		if string(e.Payload) != `{"event_id":"`+e.EventID+`"}` || e.JournalID != "j-"+e.EventID || e.Revision < 10 {
			t.Fatalf("record %s read as %+v", e.EventID, e)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("read %v, want the 30 committed records since the bound %v", got, want)
	}
	all, err := readSeen(ctx, kafka.TopicSeen{Config: kafka.Config{Brokers: c.Brokers}, Topics: []string{topic}})
	if err != nil || len(all) != 32 {
		t.Fatalf("without a bound: %d records, %v; want the 32 committed ones", len(all), err)
	}
	none, err := readSeen(ctx, kafka.TopicSeen{Config: kafka.Config{Brokers: c.Brokers}, Topics: []string{topic + ".absent"}})
	if err != nil || len(none) != 0 {
		t.Fatalf("a topic that does not exist: %v, %v", none, err)
	}
	// A transaction left open: records past it are not decided, and the
	// reader says so instead of reading short.
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, record("open-1", 200, time.Now())).FirstErr(); err != nil {
		t.Fatal(err)
	}
	_, err = readSeen(ctx, kafka.TopicSeen{Config: kafka.Config{Brokers: c.Brokers}, Topics: []string{topic}, Wait: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "transaction still open") {
		t.Fatalf("with a transaction open: %v, want an error saying so", err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	t.Logf("read %d records since the bound (of 32 committed, 2 aborted, 1 foreign) in %v", len(seen), time.Since(began).Round(time.Millisecond))
}

// TestTopicSeenWaitsOutASlowReader: the sink's reader hands a topic over
// in batches of at most ops.SeenBatch, and a reader that takes longer than
// the read's quiet time over a batch (the ledger answering slowly) does not
// end the read short: the time spent in the reader is not time spent
// waiting for a record.
func TestTopicSeenWaitsOutASlowReader(t *testing.T) {
	c := apacheCluster(t)
	topic := topicPrefix() + core.TopicEvents + ".slow"
	createTopics(t, c.Brokers, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Payloads that do not compress keep a fetch to a part of the topic,
	// so the reader gets its first batch while records are still to come.
	want := 3 * ops.SeenBatch
	recs := make([]*kgo.Record, want)
	for i := range recs {
		e := core.Envelope{EventID: fmt.Sprintf("ev-%05d", i), Kind: core.KindEvent, Type: core.TypeAccountPosted,
			AggregateType: core.AggregateAccount, AggregateID: "acc", Revision: int64(i + 1),
			Payload: []byte(`{"pad":"` + rand.Text() + rand.Text() + rand.Text() + rand.Text() + `"}`)}
		recs[i] = &kgo.Record{Key: []byte(e.AggregateID), Value: e.Payload}
		for k, v := range e.WireHeaders() {
			recs[i].Headers = append(recs[i].Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	read, batches := 0, 0
	err = kafka.TopicSeen{Config: kafka.Config{Brokers: c.Brokers}, Topics: []string{topic}}.Seen(ctx, func(batch []ops.SeenEvent) error {
		if batches++; batches == 1 {
			time.Sleep(4 * time.Second) // longer than the read's quiet time
		}
		read += len(batch)
		return nil
	})
	if err != nil || read != want || batches < 2 {
		t.Fatalf("read %d events in %d batches (%v), want all %d in 2 or more", read, batches, err, want)
	}
}

// readSeen collects what s hands over, checking that no batch is above
// ops.SeenBatch.
func readSeen(ctx context.Context, s kafka.TopicSeen) ([]ops.SeenEvent, error) {
	var out []ops.SeenEvent
	err := s.Seen(ctx, func(batch []ops.SeenEvent) error {
		if len(batch) > ops.SeenBatch {
			return fmt.Errorf("a batch of %d events, want at most %d", len(batch), ops.SeenBatch)
		}
		out = append(out, batch...)
		return nil
	})
	return out, err
}
