package integration

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// TestRelayKafkaLeadershipMoves: against a three-node kfake cluster, while
// one relay drains a backlog and postings keep arriving, partition leaders
// are shuffled, single partitions are moved to another node, and a node is
// removed and added back. Nothing the relay marked is missing from the
// topic, per account the records arrive in revision order (repeats of a
// resend allowed, never a revision ahead of one not yet seen), and the same
// relay drains everything without a restart. The fault is shown to bite:
// produce requests are answered by every node, and some by a node that is
// no longer the partition's leader (NOT_LEADER_OR_FOLLOWER), which the
// producer must recover from.
func TestRelayKafkaLeadershipMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("moves partition leaders under a draining relay")
	}
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	const partitions = 8
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, core.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	var perNode [3]atomic.Int64
	var notLeader atomic.Int64
	cluster.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		node := cluster.CurrentNode()
		if node >= 0 && node < 3 {
			perNode[node].Add(1)
		}
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range tp.Partitions {
				if cluster.LeaderFor(tp.Topic, p.Partition) != node {
					notLeader.Add(1)
				}
			}
		}
		return nil, nil, false
	})

	if err := relaytest.Fill(ctx, pool, "lead", 1000, 60); err != nil {
		t.Fatal(err)
	}
	sink := sinktest.Open(t, kafka.New, kafka.Config{Brokers: cluster.ListenAddrs()})
	r := startRelay(t, pool, sink, relay.Settings{
		Owner: "leaders", SinkName: "kafka", Logger: relayQuietLog, Registerer: prometheus.NewRegistry(),
		BatchSize: 1000, RetryInitial: 20 * time.Millisecond, RetryMax: 300 * time.Millisecond,
	})
	defer r.Stop(ctx)

	// Live postings beside the backlog, on accounts of their own.
	stopPosting := livePostings(t, pool, "live")

	rng := rand.New(rand.NewPCG(1, 2))
	moves := 0
	for round := range 30 {
		switch round % 3 {
		case 0:
			cluster.ShufflePartitionLeaders()
		case 1:
			for range 3 {
				p := int32(rng.IntN(partitions))
				to := (cluster.LeaderFor(core.TopicEvents, p) + 1 + int32(rng.IntN(2))) % 3
				if err := cluster.MoveTopicPartition(core.TopicEvents, p, to); err != nil {
					t.Fatal(err)
				}
			}
		case 2:
			if round == 5 || round == 20 {
				if err := cluster.RemoveNode(2); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond) // the node stays away a while: the pace of the fault
				if _, _, err := cluster.AddNode(2, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		moves++
		time.Sleep(100 * time.Millisecond) // the pace of the fault, not a synchronisation
	}
	posted := stopPosting()
	wait.For(t, 2*time.Minute, "the relay to drain everything", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	if err := r.Ready(); err != nil {
		t.Fatalf("relay not ready after the moves: %v", err)
	}

	lost, err := faultkit.RelayedNotOnBroker(ctx, pool, cluster.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) > 0 {
		t.Fatalf("%d events marked relayed are not on the topic, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
	checkRevisionOrder(t, cluster.ListenAddrs(), 60_000+posted)
	t.Logf("%d rounds of leader moves, %d live events posted; produce requests per node %d/%d/%d, %d partition writes sent to a non-leader",
		moves, posted, perNode[0].Load(), perNode[1].Load(), perNode[2].Load(), notLeader.Load())
	for i := range perNode {
		if perNode[i].Load() == 0 {
			t.Errorf("node %d answered no produce request: leadership never moved to it", i)
		}
	}
	if notLeader.Load() == 0 {
		t.Error("no produce request reached a non-leader: the moves did not bite the producer")
	}
}

// checkRevisionOrder reads the topic from the start (at least n distinct
// events) and fails if, per key, a record's revision is more than one
// ahead of the highest seen before it: repeats are allowed, a skipped
// revision is not.
func checkRevisionOrder(t *testing.T, brokers []string, n int) {
	t.Helper()
	cl := eventsReader(t, brokers)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	high := map[string]int64{}
	seen := map[string]bool{}
	for len(seen) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			h := headers(rec)
			id := h[core.HeaderEventID]
			rev, _ := strconv.ParseInt(h[core.HeaderRevision], 10, 64)
			key := string(rec.Key)
			if rev > high[key]+1 {
				t.Errorf("%s: revision %d on partition %d offset %d after revision %d: a revision skipped", key, rev, rec.Partition, rec.Offset, high[key])
			}
			high[key] = max(high[key], rev)
			seen[id] = true
		})
	}
	if len(seen) < n {
		t.Fatalf("read %d distinct events of %d", len(seen), n)
	}
}
