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
