package kafkagroup_test

import (
	"testing"

	"github.com/IBM/sarama"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
)

// TestSaramaConfigStartsAtTheOldestRecord: a consumer group that joins
// late must read what was published before it (field-notes.md), which
// Watermill's default, the newest offset, would skip.
func TestSaramaConfigStartsAtTheOldestRecord(t *testing.T) {
	if got := kafkagroup.SaramaConfig().Consumer.Offsets.Initial; got != sarama.OffsetOldest {
		t.Fatalf("initial offset %d, want OffsetOldest", got)
	}
}

// The subscribers fetch 256 KiB per partition, not sarama's 1 MiB: a
// fetch is decoded whole before its first record is delivered.
func TestSaramaConfigFetchesSmallFirst(t *testing.T) {
	if got := kafkagroup.SaramaConfig().Consumer.Fetch.Default; got != kafkagroup.FetchDefault || got >= 1<<20 {
		t.Fatalf("fetch size %d per partition, want %d", got, kafkagroup.FetchDefault)
	}
}
