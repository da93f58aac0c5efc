package integration

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/saramacontrol"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// apacheDrain is what one drain through a real cluster's faults saw.
type apacheDrain struct {
	backlog, posted int
	kills, moves    int // faults that came while events were pending
	lost            []string
	took            time.Duration
}

func (d apacheDrain) String() string {
	return fmt.Sprintf("%d backlog + %d live events; %d node kills and %d leader moves while events were pending; %d marked relayed but not on the topic; drained in %v",
		d.backlog, d.posted, d.kills, d.moves, len(d.lost), d.took.Round(100*time.Millisecond))
}

// drainThroughApacheFaults is TestRelayDrainThroughBrokerKills and
// TestRelayKafkaLeadershipMoves on a real three-node cluster, in one run:
// a relay drains a backlog of events while postings keep arriving, and
// faults times a node is cut off from its followers and SIGKILLed
// (killIsolated), restarted on its data directory, and then every
// partition's leader is moved (a reassignment that rotates the replicas,
// then preferred-leader elections). When the outbox is empty every event
// the relay marked relayed is looked up on the topic.
func drainThroughApacheFaults(t *testing.T, k *kafkacluster.Cluster, name string, sink core.Sink, faults int) apacheDrain {
	t.Helper()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	const accounts, perAccount = 1500, 40
	if err := relaytest.Fill(ctx, pool, name, accounts, perAccount); err != nil {
		t.Fatal(err)
	}
	d := apacheDrain{backlog: accounts * perAccount}
	began := time.Now()
	r := startRelay(t, pool, sink, relay.Settings{
		Owner: name, SinkName: "kafka", Logger: relayQuietLog, Registerer: prometheus.NewRegistry(),
		BatchSize: 1000, RetryInitial: 20 * time.Millisecond, RetryMax: 500 * time.Millisecond,
	})
	defer r.Stop(ctx)
	pending := func() int { return relaytest.Unrelayed(t, pool) }

	// Live postings beside the backlog, on accounts of their own.
	stopPosting := livePostings(t, pool, name+"-live")

	for i := range faults {
		if pending() > 0 {
			d.kills++
		}
		killIsolated(t, k, i%len(k.Nodes))
		if err := k.RestartNode(i % len(k.Nodes)); err != nil {
			t.Fatal(err)
		}
		if pending() > 0 {
			d.moves++
		}
		if err := faultkit.MoveKafkaLeaders(ctx, k.Brokers); err != nil {
			t.Fatal(err)
		}
	}
	d.posted = stopPosting()
	wait.For(t, 5*time.Minute, "the relay to drain everything", func() bool { return pending() == 0 })
	d.took = time.Since(began)
	if err := r.Ready(); err != nil {
		t.Fatalf("relay not ready after the faults: %v", err)
	}
	lost, err := faultkit.RelayedNotOnBroker(ctx, pool, k.Brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	d.lost = lost
	return d
}

// killIsolated cuts node i off from the other nodes (they are stopped,
// SIGSTOP, for a window short of replica.lag.time.max.ms, so they stay in
// sync), long enough for the node to take writes they do not fetch, then
// SIGKILLs it and lets the others go on, one of them leading its
// partitions now. What it ACKed alone in that window is lost, which acks=all
// prevents: the in-sync replicas have a record, or it is not ACKed.
func killIsolated(t *testing.T, k *kafkacluster.Cluster, i int) {
	t.Helper()
	var others []int
	for _, n := range k.Nodes {
		if n.ID != i {
			others = append(others, n.PID)
		}
	}
	signal := func(sig syscall.Signal) {
		for _, pid := range others {
			if err := syscall.Kill(pid, sig); err != nil {
				t.Errorf("%v pid %d: %v", sig, pid, err)
			}
		}
	}
	signal(syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond) // (shapes the fault; nothing waits on it)
	k.Kill(t, i)
	signal(syscall.SIGCONT)
}

// TestRelayDrainThroughFaultsApacheKafka: on a real three-node Apache
// Kafka cluster, no event the relay marked relayed is missing from the
// topic after node SIGKILLs and leader moves during the drain, per account
// the records are in revision order, and the same relay drains everything
// without a restart. Its negative control, on the same cluster, is the
// sink taking the leader's ACK alone (acks=1): the same faults lose events
// it marked relayed. Up to 2 control runs, stopping at the first that loses.
func TestRelayDrainThroughFaultsApacheKafka(t *testing.T) {
	skipInShortMode(t)
	k := kafkacluster.Start(t, 3)
	k.RequireOwn(t)
	t.Run("acks=all", func(t *testing.T) {
		sink, err := kafka.New(kafka.Config{Brokers: k.Brokers})
		if err != nil {
			t.Fatal(err)
		}
		defer sink.Close()
		d := drainThroughApacheFaults(t, k, "apache-drain", sink, 3)
		t.Logf("%s, kafka sink (kgo, acks=all): %s", k.Name(), d)
		if d.kills < 2 {
			t.Errorf("only %d of 3 node kills came while events were pending", d.kills)
		}
		if len(d.lost) > 0 {
			t.Fatalf("%d events marked relayed are not on the topic, e.g. %v", len(d.lost), d.lost[:min(5, len(d.lost))])
		}
		checkRevisionOrder(t, k.Brokers, d.backlog+d.posted)
	})
	t.Run("control: leader ACK alone", func(t *testing.T) {
		for run := 1; run <= 3; run++ {
			sink, err := saramacontrol.NewLeaderAck(k.Brokers)
			if err != nil {
				t.Fatal(err)
			}
			d := drainThroughApacheFaults(t, k, fmt.Sprintf("apache-control-%d", run), sink, 2)
			_ = sink.Close()
			t.Logf("%s, control run %d (sarama, acks=1): %s", k.Name(), run, d)
			if len(d.lost) > 0 {
				return
			}
		}
		t.Fatal("the leader-ACK sink lost nothing in 3 runs: the faults cannot tell acks=all from acks=1")
	})
}
