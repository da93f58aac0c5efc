package kafkagroup_test

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	phkafka "github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

const (
	ghostTopic      = "ghost.events"
	ghostGroup      = "balance-projection"
	ghostPartitions = 4
	ghostPerPart    = 10
)

// groupView is the broker's view of a consumer group: its state and each
// member's partitions.
type groupView struct {
	state   string
	members map[string][]int32
}

func (g groupView) String() string {
	ids := make([]string, 0, len(g.members))
	for id := range g.members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	s := g.state
	for _, id := range ids {
		s += fmt.Sprintf(" %s%v", id, g.members[id])
	}
	return s
}

func describeGroup(t *testing.T, cl *kgo.Client, group string) groupView {
	t.Helper()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatalf("describe group %s: %v", group, err)
	}
	v := groupView{members: map[string][]int32{}}
	for _, g := range resp.Groups {
		v.state = g.State
		for _, m := range g.Members {
			var a kmsg.ConsumerMemberAssignment
			_ = a.ReadFrom(m.MemberAssignment)
			v.members[m.MemberID] = []int32{}
			for _, tp := range a.Topics {
				v.members[m.MemberID] = append(v.members[m.MemberID], tp.Partitions...)
			}
		}
	}
	return v
}

// waitGroup polls the group until ok holds, for up to a minute (a liveness
// bound: each step here takes a heartbeat interval or a rebalance timeout,
// seconds).
func waitGroup(t *testing.T, cl *kgo.Client, what string, ok func(groupView) bool) groupView {
	t.Helper()
	var v groupView
	wait.ForStatus(t, time.Minute, "the group to be "+what, func() (bool, string) {
		v = describeGroup(t, cl, ghostGroup)
		return ok(v), fmt.Sprintf("%v", v)
	})
	return v
}

// ghostBroker is a kfake cluster (the broker of `posthorn dev kafka`) that
// can give ghostGroup a ghost member.
type ghostBroker struct {
	addr    string
	joining atomic.Pointer[ghostJoin] // the ghost being added, if any
}

type ghostJoin struct {
	member string
	closed chan struct{} // closed once its connection is
}

// ghostSession is the session timeout the ghost asks for: a member whose
// session timer runs is dropped this long after its last response.
const ghostSession = time.Second

func startGhostBroker(t *testing.T) *ghostBroker {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(ghostPartitions, ghostTopic),
		kfake.GroupMinSessionTimeout(ghostSession))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b := &ghostBroker{addr: c.ListenAddrs()[0]}
	// While a ghost joins, the live member's JoinGroup (it re-joins on its
	// next heartbeat) waits until the ghost's connection is closed: that
	// JoinGroup completes the rebalance, and the broker's response to the
	// ghost must then find its connection gone.
	c.ControlKey(int16(kmsg.JoinGroup), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.JoinGroupRequest)
		if g := b.joining.Load(); g != nil && req.MemberID != "" && req.MemberID != g.member {
			c.SleepControl(func() { <-g.closed })
		}
		return nil, nil, false
	})
	return b
}

// addGhostMember reproduces what the fault suite found over kfake: a
// consumer process killed while its JoinGroup waits for the rebalance it
// started. kfake arms a member's session timer when a join or sync response
// is handed to its connection; for a closed connection the hand-over is a
// select between the closed connection and room in its response buffer,
// so half the time the dead member gets no timer at all: it stays in the
// group for good and the leader assigns it partitions. The other half it
// is dropped after its session timeout; then a new ghost is tried. It
// returns the ghost's member ID and the group with the ghost in it.
func (b *ghostBroker) addGhostMember(t *testing.T, admin *kgo.Client) (string, groupView) {
	t.Helper()
	for attempt := 1; attempt <= 12; attempt++ {
		waitGroup(t, admin, "stable with one member", func(v groupView) bool { return v.state == "Stable" && len(v.members) == 1 })
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr))
		if err != nil {
			t.Fatal(err)
		}
		meta := kmsg.ConsumerMemberMetadata{Topics: []string{ghostTopic}}
		join := kmsg.NewPtrJoinGroupRequest()
		join.Group = ghostGroup
		join.SessionTimeoutMillis = int32(ghostSession.Milliseconds())
		join.RebalanceTimeoutMillis = 10000
		join.ProtocolType = "consumer"
		join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
		// The first JoinGroup only hands out the member ID (KIP-394).
		resp, err := join.RequestWith(context.Background(), cl)
		if err != nil || resp.MemberID == "" {
			t.Fatalf("first join of the ghost: %v, %+v", err, resp)
		}
		ghost := resp.MemberID
		join.MemberID = ghost
		g := &ghostJoin{member: ghost, closed: make(chan struct{})}
		b.joining.Store(g)
		go func() { _, _ = join.RequestWith(context.Background(), cl) }() // answered only when the rebalance completes
		waitGroup(t, admin, "listed the joining ghost", func(v groupView) bool { _, ok := v.members[ghost]; return ok })
		cl.Close()
		// kfake notices the closed connection on a reader goroutine of its
		// own; give it a moment before the rebalance may complete (if it
		// has not, the ghost gets its response and a timer: another try).
		time.Sleep(200 * time.Millisecond)
		close(g.closed)
		b.joining.Store(nil)
		waitGroup(t, admin, "stable again", func(v groupView) bool {
			_, in := v.members[ghost]
			return v.state == "Stable" && (!in || len(v.members[ghost]) > 0)
		})
		// A ghost with a running session timer is gone within it: wait
		// out the window in which it may still be there.
		time.Sleep(3 * ghostSession)
		v := describeGroup(t, admin, ghostGroup)
		if v.state == "Stable" && len(v.members[ghost]) > 0 {
			return ghost, v
		}
		t.Logf("attempt %d: the dead member got a session timer and was dropped (%v); again", attempt, v)
	}
	t.Fatal("no ghost member in 12 attempts (each has even odds)")
	return "", groupView{}
}

// ghostScenario runs a subscriber of ghostGroup on b, adds a ghost member
// holding partitions, publishes ghostPerPart records to every partition and
// returns the admin client, the ghost's member ID and partitions, the IDs
// published (with their partitions) and the channel of the IDs the
// subscriber acknowledges.
func ghostScenario(t *testing.T, b *ghostBroker, sub message.Subscriber) (*kgo.Client, string, []int32, map[string]int32, <-chan string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := sub.Subscribe(ctx, ghostTopic)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, ghostPartitions*ghostPerPart*2)
	go func() {
		for m := range ch {
			got <- m.UUID
			m.Ack()
		}
	}()
	admin, err := kgo.NewClient(kgo.SeedBrokers(b.addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	ghost, v := b.addGhostMember(t, admin)
	t.Logf("group with the ghost: %v", v)

	ids := map[string]int32{}
	for p := range int32(ghostPartitions) {
		for i := range ghostPerPart {
			id := fmt.Sprintf("p%d-%d", p, i)
			r := &kgo.Record{Topic: ghostTopic, Partition: p, Value: []byte("{}"),
				Headers: []kgo.RecordHeader{{Key: kafka.UUIDHeaderKey, Value: []byte(id)}}}
			if err := admin.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
			ids[id] = p
		}
	}
	return admin, ghost, v.members[ghost], ids, got
}

// TestKafkaConsumerRejoinsPastAGhostMember: a group member that died while
// joining holds partitions in a Stable group for good (see addGhostMember).
// The consumers' Kafka subscriber sees those partitions stay behind with no
// commit and re-joins the group; the rebalance drops the ghost and every
// record is delivered. A static member (Options.InstanceID) first removes
// itself by its instance ID, since joining again under it would take its
// old assignment back without a rebalance. The control is
// TestKafkaGhostMemberStallsWithoutRejoin.
func TestKafkaConsumerRejoinsPastAGhostMember(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for kfake rebalances")
	}
	t.Run("dynamic", func(t *testing.T) { rejoinPastAGhost(t, "") })
	t.Run("static", func(t *testing.T) { rejoinPastAGhost(t, "node-1") })
}

func rejoinPastAGhost(t *testing.T, instanceID string) {
	b := startGhostBroker(t)
	f, err := kafkagroup.Factory([]string{b.addr}, phkafka.Security{},
		kafkagroup.Options{Logger: outageLogger(), StallAfter: 2 * time.Second, InstanceID: instanceID})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f(ghostGroup)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	admin, ghost, _, ids, got := ghostScenario(t, b, sub)

	start := time.Now()
	seen := map[string]bool{}
	deadline := time.After(time.Minute) // liveness bound: stall time + one rebalance timeout (10 s), with room
	for len(seen) < len(ids) {
		select {
		case id := <-got:
			seen[id] = true
		case <-deadline:
			t.Fatalf("%d of %d records delivered; group: %v", len(seen), len(ids), describeGroup(t, admin, ghostGroup))
		}
	}
	v := describeGroup(t, admin, ghostGroup)
	if _, still := v.members[ghost]; still {
		t.Fatalf("every record delivered but the ghost is still a member: %v", v)
	}
	t.Logf("all %d records delivered %s after they were published; group now %v", len(ids), time.Since(start).Round(100*time.Millisecond), v)
}

// TestKafkaGhostMemberStallsWithoutRejoin is the negative control: the
// plain watermill-kafka subscriber with the same sarama configuration (what
// `posthorn consume` read with before the re-join) delivers its own
// partitions, while the ghost's stay unread and the ghost stays in the
// group past its session timeout.
func TestKafkaGhostMemberStallsWithoutRejoin(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for kfake rebalances")
	}
	b := startGhostBroker(t)
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: []string{b.addr}, Unmarshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: kafkagroup.SaramaConfig(), ConsumerGroup: ghostGroup}, outageLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	admin, ghost, ghostParts, ids, got := ghostScenario(t, b, sub)

	ghostOwns := map[int32]bool{}
	for _, p := range ghostParts {
		ghostOwns[p] = true
	}
	own := 0
	for _, p := range ids {
		if !ghostOwns[p] {
			own++
		}
	}
	seen := map[string]bool{}
	for len(seen) < own {
		select {
		case id := <-got:
			seen[id] = true
		case <-time.After(time.Minute):
			t.Fatalf("the live member delivered %d of its %d records", len(seen), own)
		}
	}
	// As long as the re-join takes in TestKafkaConsumerRejoinsPastAGhostMember
	// (the watch's first rebalance timeout, the stall time, one more
	// rebalance timeout), and 20 ghost session timeouts.
	time.Sleep(25 * time.Second)
	for len(got) > 0 {
		seen[<-got] = true
	}
	for id := range seen {
		if ghostOwns[ids[id]] {
			t.Fatalf("record %s of the ghost's partition %d was delivered: no stall to control for; group: %v", id, ids[id], describeGroup(t, admin, ghostGroup))
		}
	}
	v := describeGroup(t, admin, ghostGroup)
	if parts, still := v.members[ghost]; !still || len(parts) == 0 || v.state != "Stable" {
		t.Fatalf("the ghost should still hold partitions in a Stable group: %v", v)
	}
	t.Logf("without the re-join: %d of %d records delivered, the ghost still holds %v: %v", len(seen), len(ids), ghostParts, v)
}
