package kafkagroup_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
)

// produceTxn writes msgs to topic in watermill-kafka's format in one Kafka
// transaction, committed or aborted.
func produceTxn(t *testing.T, addrs []string, topic string, commit bool, msgs ...*message.Message) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.TransactionalID("isolation-test"), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		pm, err := wmkafka.DefaultMarshaler{}.Marshal(topic, msg)
		if err != nil {
			t.Fatal(err)
		}
		value, _ := pm.Value.Encode()
		r := &kgo.Record{Value: value}
		for _, h := range pm.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: string(h.Key), Value: h.Value})
		}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

// TestKafkaReadCommittedSubscriberSkipsAbortedRecords: on a topic that
// holds an aborted transaction between two committed ones, the
// read_committed subscriber delivers only the committed messages, and the
// plain (read_uncommitted) one the aborted copies too, which is what
// Posthorn's inbox absorbs.
func TestKafkaReadCommittedSubscriberSkipsAbortedRecords(t *testing.T) {
	t.Parallel()
	const topic = "isolation"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	msg := func(id string) *message.Message { return message.NewMessage(id, []byte(id)) }
	produceTxn(t, addrs, topic, true, msg("committed-1"))
	produceTxn(t, addrs, topic, false, msg("aborted-1"), msg("aborted-2"))
	produceTxn(t, addrs, topic, true, msg("committed-2"))
	for _, tc := range []struct {
		name string
		open func([]string, string, watermill.LoggerAdapter, ...phkafka.Security) (message.Subscriber, error)
		want []string
	}{
		{"read_committed", kafkagroup.ReadCommittedSubscriber, []string{"committed-1", "committed-2"}},
		{"read_uncommitted", kafkagroup.Subscriber, []string{"committed-1", "aborted-1", "aborted-2", "committed-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := tc.open(addrs, "group-"+tc.name, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ch, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for len(got) < len(tc.want) {
				select {
				case m := <-ch:
					got = append(got, m.UUID)
					m.Ack()
				case <-ctx.Done():
					t.Fatalf("received %v, want %v", got, tc.want)
				}
			}
			// Nothing more arrives: the committed-2 record is the last.
			select {
			case m := <-ch:
				t.Fatalf("received %v, then %s; want only %v", got, m.UUID, tc.want)
			case <-time.After(time.Second):
			}
			for i := range tc.want {
				if got[i] != tc.want[i] {
					t.Fatalf("received %v, want %v", got, tc.want)
				}
			}
		})
	}
}
