package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kfakeproc"
	"github.com/posthorn/posthorn/internal/testkit/saramacontrol"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// TestKfakeBrokerProcess is the broker process of the kill tests (this
// test binary started again by kfakeproc.Start); it skips otherwise.
func TestKfakeBrokerProcess(t *testing.T) { kfakeproc.ServeIfChild(t) }

// killHarness is the harness of the broker-kill case: a kfake broker in a
// process of its own on a data directory, SIGKILLed and started again on
// the same port and directory, and a sink built by newSink on it.
func killHarness(t *testing.T, newSink func(brokers []string) (core.Sink, error)) sinktest.Harness {
	b := kfakeproc.Start(t, "TestKfakeBrokerProcess")
	s, err := newSink([]string{b.Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return sinktest.Harness{
		Sink:  s,
		Read:  readToEnd([]string{b.Addr}),
		Keyed: true,
		Kill:  func(*testing.T) func() { return b.Kill() },
	}
}

// readToEnd reads topic from its first offset to the end offsets the broker
// reports when it is called, so it knows when it has everything and never
// waits for records that are not there (a run ACKs up to millions of
// records, some of which may be lost). It keeps only the key and the event
// ID of each record. With fewer than n records it returns them and an
// error.
func readToEnd(brokers []string) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		ends, err := endOffsets(ctx, cl, topic)
		if err != nil {
			return nil, err
		}
		todo := 0
		for _, end := range ends {
			if end > 0 {
				todo++
			}
		}
		var out []sinktest.Record
		for todo > 0 {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return out, err
			}
			fs.EachRecord(func(r *kgo.Record) {
				if r.Offset >= ends[r.Partition] {
					return
				}
				var id string
				for _, h := range r.Headers {
					if h.Key == core.HeaderEventID {
						id = string(h.Value)
					}
				}
				out = append(out, sinktest.Record{Topic: r.Topic, Key: string(r.Key), Headers: map[string]string{core.HeaderEventID: id}})
				if r.Offset == ends[r.Partition]-1 {
					todo--
				}
			})
		}
		if len(out) < n {
			return out, fmt.Errorf("%s holds %d records, fewer than %d", topic, len(out), n)
		}
		return out, nil
	}
}

// endOffsets lists the end offset of each of topic's partitions, asking
// again while a partition answers a retriable error (a leader election
// after a node's restart answers OFFSET_NOT_AVAILABLE for a moment).
func endOffsets(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	for {
		ends, err := endOffsetsOnce(ctx, cl, topic)
		var code *kerr.Error
		if err == nil || !errors.As(err, &code) || !code.Retriable || ctx.Err() != nil {
			return ends, err
		}
		time.Sleep(100 * time.Millisecond) // the election takes a moment; then ask again
	}
}

func endOffsetsOnce(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	if len(mresp.Topics) != 1 || mresp.Topics[0].ErrorCode != 0 {
		return nil, fmt.Errorf("metadata of %s: %+v", topic, mresp.Topics)
	}
	lreq := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, p := range mresp.Topics[0].Partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition = p.Partition
		lp.Timestamp = -1 // the end
		lt.Partitions = append(lt.Partitions, lp)
	}
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	ends := map[int32]int64{}
	for _, t := range lresp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p.Partition, err)
			}
			ends[p.Partition] = p.Offset
		}
	}
	return ends, nil
}

func newKafkaSink(brokers []string) (core.Sink, error) {
	return kafka.New(kafka.Config{Brokers: brokers})
}

func newSaramaControl(brokers []string) (core.Sink, error) { return saramacontrol.New(brokers) }

// TestBrokerKillsSaramaControlShort is the short negative control of the
// broker-kill case in make test: with the old sarama sink the case's
// conformance checks fail under the same kills: records ACKed after an
// earlier record of their key failed, ACKed records on the broker after a
// later revision of their key, or ACKed records absent. Loss alone shows
// up in some runs only (TestBrokerKillsSaramaControl measures how often),
// so this control wants any of the three, in at most 3 runs.
func TestBrokerKillsSaramaControlShort(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a broker process")
	}
	for i := 1; i <= 3; i++ {
		var r sinktest.KillReport
		t.Run("run"+strconv.Itoa(i), func(t *testing.T) {
			r = sinktest.MeasureKills(t, killHarness(t, newSaramaControl), sinktest.KillOptions{})
		})
		if r.Absent+r.OutOfOrder+r.Overtaken > 0 {
			t.Logf("the sarama control failed the broker-kill case in run %d: %d ACKed but absent, %d out of order, %d overtaken", i, r.Absent, r.OutOfOrder, r.Overtaken)
			return
		}
	}
	t.Errorf("the sarama control passed the broker-kill case 3 times: the case did not see the defect it exists to catch")
}

// TestBrokerKillsSaramaControl is the negative control of the broker-kill
// case: the sink Posthorn shipped before (sarama's idempotent producer)
// under the same kills reports records ACKed that the broker never stored
// (a sarama defect, reported upstream). It does so in some runs only (2 of
// 6 runs of 75 s with 12 kills, field notes), too rarely for make test, so it runs in make soak
// (POSTHORN_SOAK=1): POSTHORN_KAFKA_CONTROL_RUNS runs (default 6) of at
// least POSTHORN_KAFKA_CONTROL_DURATION (default 75s) and 12 kills each,
// 1,000-record batches; it fails if no run lost anything (the kill case
// could then not be shown to see this loss).
func TestBrokerKillsSaramaControl(t *testing.T) {
	reports := longKills(t, "sarama control", newSaramaControl)
	lossy := 0
	for _, r := range reports {
		if r.Absent > 0 {
			lossy++
		}
	}
	if lossy == 0 {
		t.Errorf("the sarama control lost nothing in %d runs: the broker-kill case did not show the loss it exists to catch", len(reports))
	}
}

// TestBrokerKillsLong runs the Kafka sink through the control's long runs
// (make soak): no run may lose an ACKed record or break order.
func TestBrokerKillsLong(t *testing.T) {
	for i, r := range longKills(t, "kgo sink", newKafkaSink) {
		if r.Absent+r.OutOfOrder+r.Overtaken+r.Permanent > 0 {
			t.Errorf("run %d: %d ACKed but absent, %d out of order, %d overtaken, %d permanent", i+1, r.Absent, r.OutOfOrder, r.Overtaken, r.Permanent)
		}
	}
}

// longKills runs MeasureKills at the soak's length against sinks built by
// newSink and logs each run's figures and the sum.
func longKills(t *testing.T, name string, newSink func([]string) (core.Sink, error)) []sinktest.KillReport {
	if os.Getenv("POSTHORN_SOAK") == "" {
		t.Skip("long broker-kill runs: make soak runs them (POSTHORN_SOAK=1)")
	}
	runs := 6
	if v := os.Getenv("POSTHORN_KAFKA_CONTROL_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("POSTHORN_KAFKA_CONTROL_RUNS=%q: want a positive number", v)
		}
		runs = n
	}
	d := 75 * time.Second
	if v := os.Getenv("POSTHORN_KAFKA_CONTROL_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("POSTHORN_KAFKA_CONTROL_DURATION=%q: %v", v, err)
		}
	}
	var reports []sinktest.KillReport
	lost, lossy, kills := 0, 0, 0
	for i := 1; i <= runs; i++ {
		var r sinktest.KillReport
		t.Run("run"+strconv.Itoa(i), func(t *testing.T) {
			r = sinktest.MeasureKills(t, killHarness(t, newSink), sinktest.KillOptions{
				Kills: 12, Duration: d, BatchSize: 1000, Keys: 200, Up: d / 13,
			})
		})
		reports = append(reports, r)
		kills += r.Kills
		if r.Absent > 0 {
			lossy++
			lost += r.Absent
		}
		t.Logf("%s run %d of %d: %d kills, %d ACKed, %d ACKed but absent, %d out of order, %d overtaken", name, i, runs, r.Kills, r.Acked, r.Absent, r.OutOfOrder, r.Overtaken)
	}
	t.Logf("%s: %d of %d runs (%d kills) lost ACKed records, %d in all", name, lossy, runs, kills, lost)
	return reports
}
