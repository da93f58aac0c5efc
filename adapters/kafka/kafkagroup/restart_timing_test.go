package kafkagroup_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
)

// restartBacklog is the records a restarted consumer catches up on.
const restartBacklog = 3000

// TestKafkaConsumerRestartTimings: a consumer dies without leaving its
// Stable group (as a SIGKILLed `posthorn consume` does) while a backlog of
// restartBacklog records waits on its three partitions, and is started
// again: the time from its death to its first message and to the whole
// backlog delivered, with static membership (an instance ID) and dynamic,
// on kfake and on a real Apache Kafka node, side by side. On both brokers
// the static member takes its partitions back before the dead member's
// session would have run out, and the dynamic one (the control) waits for
// that session.
func TestKafkaConsumerRestartTimings(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for dead members' sessions and starts an Apache Kafka node")
	}
	fake, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	apache := kafkacluster.Start(t, 1)
	under := []struct{ name, addr string }{
		{"kfake", fake.ListenAddrs()[0]},
		{apache.Name(), apache.Brokers[0]},
	}
	var table []string
	for _, b := range under {
		for _, static := range []bool{true, false} {
			mode := "dynamic"
			if static {
				mode = "static"
			}
			t.Run(strings.Fields(b.name)[0]+"/"+mode, func(t *testing.T) {
				g := memberGroup{topic: "restart." + mode, group: "restart-" + mode, partitions: 3}
				fillPartitions(t, b.addr, g, restartBacklog)
				var instance *string
				var opts kafkagroup.Options
				if static {
					id := "node-1." + g.topic // the member's instance ID on the topic
					instance, opts.InstanceID = &id, "node-1"
				}
				joinAndDie(t, b.addr, g, instance)
				died := time.Now()
				first, all := catchUp(t, kafkaSubscriberOf(t, b.addr, g.group, opts), g.topic, restartBacklog, died)
				table = append(table, fmt.Sprintf("%-40s %-8s first message %6v, %d records caught up %6v",
					b.name, mode, first.Round(10*time.Millisecond), restartBacklog, all.Round(10*time.Millisecond)))
				if static && first >= deadSession {
					t.Errorf("the restarted static member got its first message %v after the death, not before the dead member's session (%v) ran out", first, deadSession)
				}
				if !static && first < deadSession/2 {
					t.Errorf("the dynamic successor got its first message %v after the death: the dead member's session (%v) did not hold the group, no wait to control for", first, deadSession)
				}
			})
		}
	}
	t.Logf("consumer restarts after a death in a Stable group, dead member's session %v:\n%s", deadSession, strings.Join(table, "\n"))
}

// fillPartitions creates g's topic and writes n records over its
// partitions, each with its own message UUID.
func fillPartitions(t *testing.T, addr string, g memberGroup, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, int32(g.partitions), -1, nil, g.topic); err != nil {
		t.Fatalf("create %s: %v", g.topic, err)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: g.topic, Partition: int32(i % g.partitions), Value: []byte("{}"),
			Headers: []kgo.RecordHeader{{Key: kafka.UUIDHeaderKey, Value: fmt.Appendf(nil, "%s-%d", g.topic, i)}}}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", g.topic, err)
	}
}

// catchUp subscribes sub to topic and acknowledges messages until n
// distinct ones arrived; it returns how long after since the first came
// and the last.
func catchUp(t *testing.T, sub message.Subscriber, topic string, n int, since time.Time) (first, all time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a liveness bound
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed after %d of %d messages", len(seen), n)
			}
			if len(seen) == 0 {
				first = time.Since(since)
			}
			seen[m.UUID] = true
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("%d of %d messages within 2 minutes", len(seen), n)
		}
	}
	return first, time.Since(since)
}
