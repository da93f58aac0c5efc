package kafka_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// The reference values of Kafka's own UtilsTest.testMurmur2.
func TestJavaMurmur2MatchesKafkasTestVectors(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := kafkatest.JavaMurmur2([]byte(in)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", in, got, want)
		}
	}
}

// saramaPartition is where sarama's hash partitioner (FNV-1a), which
// Posthorn's earlier versions used, puts key.
func saramaPartition(t *testing.T, key string, n int) int32 {
	p, err := sarama.NewHashPartitioner("t").Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, int32(n))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// placement publishes one record per key through a sink with the given
// partitioner to a fresh broker and returns the partition each key landed on,
// read back by a plain kgo consumer.
func placement(t *testing.T, partitioner string, keys []string, partitions int) map[string]int32 {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), core.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	s, err := kafka.New(kafka.Config{Brokers: cluster.ListenAddrs(), Partitioner: partitioner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	batch := make([]core.Envelope, len(keys))
	for i, k := range keys {
		batch[i] = sinktest.Envelope(core.TopicEvents, k, 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Publish(ctx, batch); err != nil {
		t.Fatalf("publish: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(core.TopicEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]int32{}
	for len(got) < len(keys) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[string(r.Key)] = r.Partition })
	}
	if len(got) != len(keys) {
		t.Fatalf("read back %d of %d keys", len(got), len(keys))
	}
	return got
}

func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("acc-%d", i)
	}
	return append(keys, "a", "ab", "abc", "acc-alice", "acc-bob", "x:y.z-1")
}

// The default placement is the Java client's: (murmur2(key) & 0x7fffffff) %
// partitions. Its control: FNV-1a places most keys elsewhere, so the check
// would notice the old placement.
func TestDefaultPartitionerIsJavas(t *testing.T) {
	t.Parallel()
	const partitions = 12
	keys := testKeys(200)
	got := placement(t, "", keys, partitions)
	differ := 0
	for _, k := range keys {
		if want := int32(kafkatest.JavaPartition(k, partitions)); got[k] != want {
			t.Errorf("key %q on partition %d, Java's partitioner says %d", k, got[k], want)
		}
		if saramaPartition(t, k, partitions) != got[k] {
			differ++
		}
	}
	if differ < len(keys)/2 {
		t.Errorf("only %d of %d keys placed differently by FNV-1a: the check cannot tell the two placements apart", differ, len(keys))
	}
}

// sink.kafka.partitioner: fnv1a keeps sarama's placement, key for key.
func TestFNV1aPartitionerKeepsSaramasPlacement(t *testing.T) {
	t.Parallel()
	const partitions = 12
	keys := testKeys(200)
	got := placement(t, kafka.PartitionerFNV1a, keys, partitions)
	for _, k := range keys {
		if want := saramaPartition(t, k, partitions); got[k] != want {
			t.Errorf("key %q on partition %d, sarama's hash partitioner says %d", k, got[k], want)
		}
	}
}

func TestUnknownPartitionerIsRefused(t *testing.T) {
	t.Parallel()
	_, err := kafka.New(kafka.Config{Brokers: []string{"127.0.0.1:9"}, Partitioner: "crc32"})
	if err == nil || !strings.Contains(err.Error(), "crc32") {
		t.Fatalf("New with partitioner crc32: %v, want an error naming it", err)
	}
}

// The configuration accepts exactly the partitioners the sink knows.
func TestConfigKnowsTheSinksPartitioners(t *testing.T) {
	t.Parallel()
	if !slices.Equal(configs.KafkaPartitioners, kafka.Partitioners) {
		t.Fatalf("configs.KafkaPartitioners %v, kafka.Partitioners %v", configs.KafkaPartitioners, kafka.Partitioners)
	}
}

// The old sarama sink is a test control: the binary never links it.
func TestBinaryDoesNotImportSaramaControl(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/posthorn/posthorn/cmd/posthorn").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/posthorn/posthorn/adapters/kafka\n") {
		t.Fatalf("go list -deps of the binary does not list adapters/kafka: the check is broken")
	}
	if strings.Contains(string(out), "internal/testkit/saramacontrol") {
		t.Fatal("cmd/posthorn depends on internal/testkit/saramacontrol, the negative control")
	}
}

// A topic the broker does not have yet (a new commands.<service>) is
// created on first use where the broker allows it, as with the sarama
// producer before: the sink asks for it in its metadata requests.
func TestPublishCreatesANewTopicWhereTheBrokerAllows(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	s, err := kafka.New(kafka.Config{Brokers: cluster.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Publish(ctx, []core.Envelope{sinktest.Envelope("commands.newservice", "journal-1", 1)}); err != nil {
		t.Fatalf("publish to a topic the broker creates on first use: %v", err)
	}
}
