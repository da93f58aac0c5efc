package kafkagroup

import (
	"maps"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The member's unmarshal gives the message watermill-kafka's
// DefaultMarshaler gives (the marshaler the relay's sink writes with):
// UUID, metadata and payload, for records with and without a UUID header,
// with empty and repeated headers, and with no headers at all.
func TestUnmarshalAsWatermillKafkas(t *testing.T) {
	records := []*sarama.ConsumerMessage{
		{Value: []byte(`{"a":1}`), Headers: []*sarama.RecordHeader{
			{Key: []byte(wmkafka.UUIDHeaderKey), Value: []byte("0193-id")},
			{Key: []byte("event_id"), Value: []byte("0193-id")},
			{Key: []byte("empty"), Value: nil},
			{Key: []byte(""), Value: []byte("no key")},
			{Key: []byte("twice"), Value: []byte("first")},
			{Key: []byte("twice"), Value: []byte("second")},
		}},
		{Value: []byte("payload"), Headers: []*sarama.RecordHeader{{Key: []byte("only"), Value: []byte("header")}}},
		{Value: nil},
	}
	for i, r := range records {
		want, err := wmkafka.DefaultMarshaler{}.Unmarshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got := unmarshal(r)
		if got.UUID != want.UUID || string(got.Payload) != string(want.Payload) || !maps.Equal(got.Metadata, want.Metadata) {
			t.Errorf("record %d: %q %q %v, want %q %q %v", i, got.UUID, got.Payload, got.Metadata, want.UUID, want.Payload, want.Metadata)
		}
	}
}

// A message's context carries its record's partition, offset and
// timestamp, as the lag and the end-to-end benchmark read them.
func TestMessageContextNamesItsRecord(t *testing.T) {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	msg := message.NewMessage("id", nil)
	msg.SetContext(withRecord(msg.Context(), &sarama.ConsumerMessage{Partition: 7, Offset: 42, Timestamp: at}))
	if p, o, ok := messagePartition(msg.Context()); !ok || p != 7 || o != 42 {
		t.Errorf("partition and offset %d %d %v, want 7 42", p, o, ok)
	}
	if ts, ok := RecordTimestamp(msg.Context()); !ok || !ts.Equal(at) {
		t.Errorf("timestamp %v %v, want %v", ts, ok, at)
	}
	if _, ok := RecordTimestamp(message.NewMessage("other", nil).Context()); ok {
		t.Error("a message from elsewhere has a record timestamp")
	}
}

// BenchmarkUnmarshal: the member's unmarshal against watermill-kafka's, on
// a record with the relay's eleven headers.
func BenchmarkUnmarshal(b *testing.B) {
	r := &sarama.ConsumerMessage{Value: []byte(`{"account":"acc-1","revision":1,"currency":"EUR","delta":"1"}`)}
	for _, k := range []string{wmkafka.UUIDHeaderKey, "event_id", "kind", "type", "aggregate_type", "aggregate_id", "revision",
		"journal_id", "occurred_at", "traceparent", "content_type"} {
		r.Headers = append(r.Headers, &sarama.RecordHeader{Key: []byte(k), Value: []byte("0193a4b2-5c6d-7e8f-9a0b-1c2d3e4f5a6b")})
	}
	b.Run("watermill-kafka", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = wmkafka.DefaultMarshaler{}.Unmarshal(r)
		}
	})
	b.Run("member", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = unmarshal(r)
		}
	})
}
