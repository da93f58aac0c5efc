package kafkagroup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

func TestKafkaOffsetLag(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "lag"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: cluster.ListenAddrs(), Marshaler: kafka.DefaultMarshaler{}}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range 3 {
		if err := pub.Publish("lag", message.NewMessage(fmt.Sprint(i), []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	f, err := kafkagroup.Factory(cluster.ListenAddrs(), phkafka.Security{},
		kafkagroup.Options{Registerer: reg, LagInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f("lag-consumer")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, "lag")
	if err != nil {
		t.Fatal(err)
	}
	lag := func() (float64, bool) { return lagValue(t, reg) }
	first := <-ch // not acknowledged yet: two records behind it
	waitLag(t, lag, 2)
	first.Ack()
	for range 2 {
		(<-ch).Ack()
	}
	waitLag(t, lag, 0)
}

// lagValue reads posthorn_consumer_offset_lag; ok is false before the
// first sample.
func lagValue(t *testing.T, reg *prometheus.Registry) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "posthorn_consumer_offset_lag" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func waitLag(t *testing.T, lag func() (float64, bool), want float64) {
	t.Helper()
	wait.ForStatus(t, 30*time.Second, fmt.Sprintf("offset lag %v", want), func() (bool, string) {
		got, ok := lag()
		return ok && got == want, fmt.Sprintf("%v (known %v)", got, ok)
	})
}
