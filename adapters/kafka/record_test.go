package kafka_test

import (
	"maps"
	"strings"
	"testing"
	"time"

	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
)

// The sink builds each record straight from the envelope, and it is the
// record watermill-kafka's partitioning marshaler makes of the envelope's
// Watermill message (the UUID header first, every wire header, the
// aggregate ID as the key, the payload as the value), extra headers that
// pose as contract headers included; a record that carries Watermill's
// reserved header itself is refused with the marshaler's error.
func TestRecordIsWatermillKafkasFormat(t *testing.T) {
	t.Parallel()
	s, err := kafka.New(kafka.Config{Brokers: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	marshaler := wmkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get(core.HeaderAggregateID), nil
	})
	for _, e := range []core.Envelope{
		{EventID: "e-1", Kind: core.KindEvent, Type: core.TypeAccountPosted, Topic: core.TopicEvents, AggregateType: "account",
			AggregateID: "acc-1", Revision: 7, JournalID: "j-1", OccurredAt: time.Date(2026, 12, 5, 1, 2, 3, 4, time.UTC),
			LedgerTimeline: 2, Replay: true, Payload: []byte(`{"delta":"5"}`),
			Headers: map[string]string{"meta_reference": "inv-1", core.HeaderIdempotencyDigest: "d", core.HeaderRevision: "99", "resend": "true"}},
		{EventID: "e-2", Kind: core.KindCommand, Type: "payouts.payout.execute", Topic: "commands.payouts", AggregateType: "journal",
			AggregateID: "j-2", Revision: 1, SchemaVersion: 3, ContentType: "application/avro", Payload: nil},
	} {
		got, err := s.Record(e)
		if err != nil {
			t.Fatal(err)
		}
		pm, err := marshaler.Marshal(e.Topic, e.ToMessage())
		if err != nil {
			t.Fatal(err)
		}
		key, _ := pm.Key.Encode()
		value, _ := pm.Value.Encode()
		want := map[string]string{}
		for _, h := range pm.Headers {
			want[string(h.Key)] = string(h.Value)
		}
		have := map[string]string{}
		for _, h := range got.Headers {
			if _, dup := have[h.Key]; dup {
				t.Fatalf("%s: header %s twice", e.EventID, h.Key)
			}
			have[h.Key] = string(h.Value)
		}
		if got.Topic != e.Topic || string(got.Key) != string(key) || string(got.Value) != string(value) || !maps.Equal(have, want) ||
			got.Headers[0].Key != wmkafka.UUIDHeaderKey {
			t.Fatalf("%s: record topic %s key %q value %q headers %v; the marshaler's: key %q value %q headers %v",
				e.EventID, got.Topic, got.Key, got.Value, have, key, value, want)
		}
	}
	_, err = s.Record(core.Envelope{EventID: "e-3", Topic: "t", Headers: map[string]string{wmkafka.UUIDHeaderKey: "x"}})
	if err == nil || !strings.Contains(err.Error(), "is reserved by watermill") {
		t.Fatalf("a record with Watermill's reserved header: %v", err)
	}
}
