package kafka_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// sarama starts go-metrics' global meter ticker once per process. The
// Apache Kafka cluster the ApacheKafka tests share is stopped at the end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		// After broker SIGKILLs the sarama control (kills_test.go) can
		// leave a broker connection's receiver behind its closed producer.
		goleak.IgnoreTopFunction("github.com/IBM/sarama.(*Broker).responseReceiver"),
		goleak.Cleanup(func(code int) { os.Exit(stopApacheCluster(code)) }))
}

// TestConformance runs the suite against kfake over real sockets; the
// outage closes the broker and starts it again on the same port and data
// directory, as a broker restart would.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		if t.Name() == "TestConformance/"+sinktest.KillCase && !testing.Short() {
			return killHarness(t, newKafkaSink) // kills_test.go
		}
		dir := t.TempDir()
		opts := []kfake.Opt{
			kfake.NumBrokers(1),
			kfake.SeedTopics(4, core.TopicEvents, "commands.payouts"),
			kfake.AllowAutoTopicCreation(),
			kfake.DataDir(dir),
		}
		cluster, err := kfake.NewCluster(opts...)
		if err != nil {
			t.Fatal(err)
		}
		addrs := cluster.ListenAddrs()
		t.Cleanup(func() { cluster.Close() })
		s, err := kafka.New(kafka.Config{Brokers: addrs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return sinktest.Harness{
			Sink:     s,
			Read:     ReadFunc(addrs),
			Keyed:    true,
			TooLarge: make([]byte, 2<<20),
			Outage:   restartOutage(&cluster, opts),
		}
	})
}

// restartOutage is the Outage of a harness on a one-broker kfake cluster
// started with opts (a kfake.DataDir among them): it closes *cluster and
// starts it again on the same port and data directory, as a broker restart
// would, and stores the new cluster in *cluster, so that cleanups reading
// *cluster close the one running.
func restartOutage(cluster **kfake.Cluster, opts []kfake.Opt) func(t *testing.T) func() {
	addr := (*cluster).ListenAddrs()[0]
	return func(t *testing.T) func() {
		(*cluster).Close()
		return func() {
			_, port, _ := splitPort(addr)
			c, err := kfake.NewCluster(append(opts, kfake.Ports(port))...)
			if err != nil {
				t.Fatalf("restart kfake on %s: %v", addr, err)
			}
			*cluster = c
		}
	}
}

func splitPort(addr string) (string, int, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			p, err := strconv.Atoi(addr[i+1:])
			return addr[:i], p, err
		}
	}
	return addr, 0, nil
}

// ReadFunc reads a topic from its first offset with franz-go, which exposes
// the record key that a Watermill subscriber hides.
// opts are added to the client's (e.g. TLS and SASL).
func ReadFunc(brokers []string, opts ...kgo.Opt) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond)}, opts...)...)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		var out []sinktest.Record
		for len(out) < n {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return out, err
			}
			fs.EachRecord(func(r *kgo.Record) {
				h := map[string]string{}
				for _, rh := range r.Headers {
					h[rh.Key] = string(rh.Value)
				}
				out = append(out, sinktest.Record{Topic: r.Topic, Key: string(r.Key), Headers: h, Payload: r.Value})
			})
		}
		return out, nil
	}
}
