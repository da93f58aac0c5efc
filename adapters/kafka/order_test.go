package kafka_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// TestPublishCutShortSendsNoRevisionAheadOfAnEarlierOne: a Publish whose
// context ends while the producer's buffer is full must not hand the
// producer a later revision of an account whose earlier revision the
// producer refused. The producer (kgo) fails a record that waits for room
// in its buffer when the context ends, but it takes the next record it is
// given once there is room, whatever the context, and a batch queued
// behind one in flight is sent without a look at the context: the later
// revision is stored, the earlier one is not, and the relay's resend puts
// the earlier one after it on the topic. It is what the partition suite's
// controller quorum split found (a stuck leader's records filled the
// buffer, the relay's lease deadline passed while it waited, the heal
// freed the room). kfake holds the produce requests here, which the real
// cluster cannot do on cue.
func TestPublishCutShortSendsNoRevisionAheadOfAnEarlierOne(t *testing.T) {
	t.Parallel()
	if first, err := publishCutShort(t, false); err != nil {
		t.Fatal(err)
	} else if len(first) != 2 || first[0] != 1 || first[1] != 2 {
		t.Fatalf("first copies of the account's revisions on the topic, in offset order: %v; want [1 2]", first)
	}
}

// Its negative control: the sink that goes on producing after its context
// ended, as it did before, stores revision 2 ahead of revision 1 (up to
// three runs, stopping at the first that shows it: the case turns on a few
// hundred milliseconds of the producer's timing).
func TestPublishCutShortControlSendsALaterRevisionFirst(t *testing.T) {
	t.Parallel()
	var first []int64
	for run := range 3 {
		var err error
		if first, err = publishCutShort(t, true); err != nil {
			t.Fatal(err)
		}
		t.Logf("control, run %d: first copies of the account's revisions in offset order %v", run+1, first)
		if len(first) == 2 && first[0] == 2 {
			return
		}
	}
	t.Fatalf("the control should store revision 2 first; first copies in offset order: %v", first)
}

// publishCutShort builds the case on a two-node kfake cluster and returns
// the revisions of account k in the order of their first copies on the
// topic, after the relay's resend. Partition 0 (node 0) stands for the
// stuck leader, partition 1 (node 1) for a healthy one; the producer holds
// at most 5 records.
func publishCutShort(t *testing.T, produceAfterCancel bool) ([]int64, error) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(2, core.TopicEvents))
	if err != nil {
		return nil, err
	}
	t.Cleanup(cluster.Close)
	for p := range int32(2) {
		if err := cluster.MoveTopicPartition(core.TopicEvents, p, p); err != nil {
			return nil, err
		}
	}
	stuck, k, j := keyOn(0, "stuck"), keyOn(1, "k"), keyOn(1, "j")

	// The hook runs as the sink hands the producer k's revision 2 (the
	// control only: the fixed sink never does): the stuck leader answers,
	// room frees up, and the record goes in.
	var release sync.Once
	releaseStuck := make(chan struct{})
	var s *kafka.Sink
	hook := handedOver(func(r *kgo.Record) {
		if string(r.Key) != k || revision(r) != 2 {
			return
		}
		release.Do(func() { close(releaseStuck) })
		if !wait.UntilEvery(10*time.Second, 5*time.Millisecond, func() (bool, string) { return s.BufferedRecords() <= 1, "" }) {
			t.Error("no room in the producer's buffer within 10s")
		}
	})
	s, err = kafka.New(kafka.Config{Brokers: cluster.ListenAddrs(),
		ClientOpts: []kgo.Opt{kgo.MaxBufferedRecords(5), kgo.WithHooks(hook)}})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = s.Close() })
	if produceAfterCancel {
		s.SetProduceAfterCancel()
	}
	env := func(key string, rev int64) core.Envelope { return sinktest.Envelope(core.TopicEvents, key, rev) }
	k1, k2 := env(k, 1), env(k, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Both partitions have taken a record: the producer pipelines the next
	// batch of a partition behind one in flight.
	if err := s.Publish(ctx, []core.Envelope{env(stuck, 1), env(j, 1)}); err != nil {
		return nil, fmt.Errorf("first publish: %w", err)
	}

	// Node 0 stops answering: the batch for the stuck leader waits in the
	// producer, 4 of its 5 records, after its Publish gave up.
	hold(cluster, 0, releaseStuck)
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	err = s.Publish(short, []core.Envelope{env(stuck, 2), env(stuck, 3), env(stuck, 4), env(stuck, 5)})
	cancelShort()
	if err == nil {
		return nil, fmt.Errorf("the publish to the stuck leader returned nil")
	}

	// Node 1 holds its next produce request until the cut-short Publish
	// returned. j's revision 2 takes the last room and is in flight; k's
	// revision 1 waits for room until the deadline and is refused.
	releaseHealthy := make(chan struct{})
	hold(cluster, 1, releaseHealthy)
	short, cancelShort = context.WithTimeout(ctx, 500*time.Millisecond)
	err = s.Publish(short, []core.Envelope{env(j, 2), k1, k2})
	cancelShort()
	if err == nil {
		return nil, fmt.Errorf("the cut-short publish returned nil")
	}
	release.Do(func() { close(releaseStuck) })
	close(releaseHealthy)
	if !wait.Until(10*time.Second, func() (bool, string) { return s.BufferedRecords() == 0, "" }) {
		return nil, fmt.Errorf("the producer's records not resolved within 10s")
	}

	// The relay's resend: k from its first unmarked revision.
	if err := s.Publish(ctx, []core.Envelope{k1, k2}); err != nil {
		return nil, fmt.Errorf("resend: %w", err)
	}
	return firstRevisions(ctx, cluster.ListenAddrs(), k)
}

// firstRevisions reads partition 1 of the event topic through its end and
// returns key's revisions in the order of their first copies.
func firstRevisions(ctx context.Context, brokers []string, key string) ([]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{core.TopicEvents: {1: kgo.NewOffset().AtStart()}}),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	end, err := endOffset(ctx, cl, 1)
	if err != nil {
		return nil, err
	}
	seen := map[int64]bool{}
	var first []int64
	for next := int64(0); next < end; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fs.EachRecord(func(r *kgo.Record) {
			next = r.Offset + 1
			if string(r.Key) != key || seen[revision(r)] {
				return
			}
			seen[revision(r)] = true
			first = append(first, revision(r))
		})
	}
	return first, nil
}

func endOffset(ctx context.Context, cl *kgo.Client, partition int32) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	topic := kmsg.NewListOffsetsRequestTopic()
	topic.Topic = core.TopicEvents
	p := kmsg.NewListOffsetsRequestTopicPartition()
	p.Partition, p.Timestamp = partition, -1
	topic.Partitions = append(topic.Partitions, p)
	req.Topics = append(req.Topics, topic)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			return p.Offset, nil
		}
	}
	return 0, fmt.Errorf("list offsets: no partition in the answer")
}

// hold makes node's produce requests wait until release is closed.
func hold(cluster *kfake.Cluster, node int32, release <-chan struct{}) {
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if cluster.CurrentNode() == node {
			cluster.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
}

// keyOn returns the first key prefix-N placed on partition p of two.
func keyOn(p int, prefix string) string {
	for i := 0; ; i++ {
		if key := prefix + "-" + strconv.Itoa(i); kafkatest.JavaPartition(key, 2) == p {
			return key
		}
	}
}

func revision(r *kgo.Record) int64 {
	n, _ := strconv.ParseInt(kafkatest.Header(r, core.HeaderRevision), 10, 64)
	return n
}

// handedOver is a kgo hook called as each record is handed to the
// producer (Produce), before it waits for room.
type handedOver func(*kgo.Record)

func (h handedOver) OnProduceRecordBuffered(r *kgo.Record) { h(r) }
