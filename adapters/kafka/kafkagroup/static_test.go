package kafkagroup_test

import (
	"context"
	"fmt"
	"strings"
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
)

const (
	staticTopic      = "static.events"
	staticGroup      = "audit-log"
	staticPartitions = 3
	// deadSession is the session (and rebalance) timeout of the member
	// that dies: a dynamic successor waits for it, a static one must not.
	deadSession = 10 * time.Second
)

// staticBroker is a kfake cluster with staticTopic holding a record on
// every partition.
func staticBroker(t *testing.T) (addr string, admin *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(staticPartitions, staticTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addr = c.ListenAddrs()[0]
	admin, err = kgo.NewClient(kgo.SeedBrokers(addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	for p := range int32(staticPartitions) {
		r := &kgo.Record{Topic: staticTopic, Partition: p, Value: []byte("{}"),
			Headers: []kgo.RecordHeader{{Key: kafka.UUIDHeaderKey, Value: []byte(fmt.Sprintf("p%d", p))}}}
		if err := admin.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return addr, admin
}

// memberGroup is a consumer group and the topic its members read.
type memberGroup struct {
	topic, group string
	partitions   int
}

// staticGroupOf is the static-membership tests' group on the kfake broker.
var staticGroupOf = memberGroup{staticTopic, staticGroup, staticPartitions}

// joinAndDie makes a member of g's group (static with instance, dynamic
// when it is nil) that takes every partition of g's topic and then stops
// without leaving, as a consumer process SIGKILLed in a Stable group. It
// returns when the broker answered the member's last request.
func joinAndDie(t *testing.T, addr string, g memberGroup, instance *string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	meta := kmsg.ConsumerMemberMetadata{Topics: []string{g.topic}}
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.InstanceID = g.group, instance
	join.SessionTimeoutMillis = int32(deadSession.Milliseconds())
	join.RebalanceTimeoutMillis = int32(deadSession.Milliseconds())
	join.ProtocolType = "consumer"
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
	resp, err := join.RequestWith(ctx, cl)
	if err == nil && resp.ErrorCode != 0 && resp.MemberID != "" { // a dynamic member's first join only hands out its ID (KIP-394)
		join.MemberID = resp.MemberID
		resp, err = join.RequestWith(ctx, cl)
	}
	if err != nil || resp.ErrorCode != 0 || resp.LeaderID != resp.MemberID {
		t.Fatalf("join of the member that dies: %v, %+v", err, resp)
	}
	every := make([]int32, g.partitions)
	for p := range every {
		every[p] = int32(p)
	}
	all := kmsg.ConsumerMemberAssignment{Topics: []kmsg.ConsumerMemberAssignmentTopic{{Topic: g.topic, Partitions: every}}}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.Generation, sync.MemberID, sync.InstanceID = g.group, resp.Generation, resp.MemberID, instance
	sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("range")
	sync.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: resp.MemberID, MemberAssignment: all.AppendTo(nil)}}
	sresp, err := sync.RequestWith(ctx, cl)
	if err != nil || sresp.ErrorCode != 0 {
		t.Fatalf("sync of the member that dies: %v, %+v", err, sresp)
	}
}

// subscribe subscribes sub to staticTopic until the test ends.
func subscribe(t *testing.T, sub message.Subscriber) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := sub.Subscribe(ctx, staticTopic)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// firstDelivery subscribes sub to staticTopic and returns how long after
// since its first message arrived (it is not acknowledged), and the
// subscription.
func firstDelivery(t *testing.T, sub message.Subscriber, since time.Time) (time.Duration, <-chan *message.Message) {
	t.Helper()
	ch := subscribe(t, sub)
	select {
	case <-ch:
		return time.Since(since), ch
	case <-time.After(time.Minute): // a liveness bound: a rebalance takes deadSession
		t.Fatal("no message within a minute")
		return 0, nil
	}
}

// fencedScenario runs two members with instance ID node-1 one after the
// other, each with its own fenced counter, and returns the first's
// subscription and counter once the second has a message.
func fencedScenario(t *testing.T, addr string) (<-chan *message.Message, *atomic.Int32, *atomic.Int32) {
	t.Helper()
	var first, second atomic.Int32
	_, ch := firstDelivery(t, kafkaSubscriber(t, addr, kafkagroup.Options{InstanceID: "node-1", Fenced: func(err error) {
		if !strings.Contains(err.Error(), "node-1."+staticTopic) {
			t.Errorf("fenced error %q does not name the instance ID", err)
		}
		first.Add(1)
	}}), time.Now())
	firstDelivery(t, kafkaSubscriber(t, addr, kafkagroup.Options{InstanceID: "node-1", Fenced: func(error) { second.Add(1) }}), time.Now())
	return ch, &first, &second
}

// closedWithin drains ch and reports whether it closed within d.
func closedWithin(ch <-chan *message.Message, d time.Duration) bool {
	deadline := time.After(d)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

func kafkaSubscriber(t *testing.T, addr string, opts kafkagroup.Options) message.Subscriber {
	t.Helper()
	return kafkaSubscriberOf(t, addr, staticGroup, opts)
}

// kafkaSubscriberOf is the subscriber posthorn consume opens for the
// consumer named group.
func kafkaSubscriberOf(t *testing.T, addr, group string, opts kafkagroup.Options) message.Subscriber {
	t.Helper()
	opts.Logger = outageLogger()
	f, err := kafkagroup.Factory([]string{addr}, phkafka.Security{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f(group)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// TestKafkaStaticMemberTakesItsPartitionsBack: a consumer restarted with
// its instance ID (Options.InstanceID) replaces its dead member and gets
// its partitions at once, where a dynamic successor
// (TestKafkaDynamicMemberWaitsForTheDeadSession, the control) waits for
// the dead member's session to time out.
func TestKafkaStaticMemberTakesItsPartitionsBack(t *testing.T) {
	addr, admin := staticBroker(t)
	id := "node-1." + staticTopic // the instance ID of node-1's member on the topic
	joinAndDie(t, addr, staticGroupOf, &id)
	died := time.Now()
	if v := describeGroup(t, admin, staticGroup); v.state != "Stable" || len(v.members) != 1 {
		t.Fatalf("group with the dead member: %v", v)
	}
	took, _ := firstDelivery(t, kafkaSubscriber(t, addr, kafkagroup.Options{InstanceID: "node-1"}), died)
	if took >= deadSession {
		t.Fatalf("the restarted static member got its first message %s after the death, not before the dead session (%s) ran out", took, deadSession)
	}
	t.Logf("static member: first message %s after the restart (dead member's session %s)", took.Round(10*time.Millisecond), deadSession)
}

// TestKafkaDynamicMemberWaitsForTheDeadSession is the control: without an
// instance ID the successor is a new member, and the group's rebalance
// waits for the dead one until its session (or the rebalance) times out.
func TestKafkaDynamicMemberWaitsForTheDeadSession(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a dead member's session")
	}
	addr, _ := staticBroker(t)
	joinAndDie(t, addr, staticGroupOf, nil)
	died := time.Now()
	took, _ := firstDelivery(t, kafkaSubscriber(t, addr, kafkagroup.Options{}), died)
	if took < deadSession/2 {
		t.Fatalf("the dynamic successor got a message %s after the death: the dead member's session did not hold the group, no wait to control for", took)
	}
	t.Logf("dynamic member: first message %s after the restart (dead member's session %s)", took.Round(10*time.Millisecond), deadSession)
}

// TestKafkaStaticMemberFencedStops: a second consumer joining with the
// same instance ID fences the first, which stops (its subscription closes)
// and reports it through Options.Fenced (posthorn consume then exits
// naming the key) instead of taking the ID back; the second reads on.
// The control is TestKafkaFencedMemberWithoutStopControl.
func TestKafkaStaticMemberFencedStops(t *testing.T) {
	addr, _ := staticBroker(t)
	ch, first, second := fencedScenario(t, addr)
	if !closedWithin(ch, time.Minute) { // liveness: the next heartbeat (2 s) finds the first fenced
		t.Fatal("the fenced member's subscription is still open after a minute")
	}
	if n := first.Load(); n != 1 {
		t.Fatalf("the fenced member reported %d times, want once", n)
	}
	time.Sleep(5 * time.Second) // two heartbeats: a first member joining again would fence the second now
	if n := second.Load(); n != 0 {
		t.Fatalf("the second member was fenced %d times: the first took the ID back", n)
	}
}

// TestKafkaFencedMemberWithoutStopControl is the negative control: with
// the stop switched off, the fenced member's subscription stays open and
// it keeps trying to join under the ID it lost, delivering nothing, and
// nothing reports it: its process would run on unnoticed.
func TestKafkaFencedMemberWithoutStopControl(t *testing.T) {
	kafkagroup.IgnoreFenced(true)
	t.Cleanup(func() { kafkagroup.IgnoreFenced(false) })
	addr, admin := staticBroker(t)
	ch, first, _ := fencedScenario(t, addr)
	if closedWithin(ch, 8*time.Second) { // four heartbeats and re-joins
		t.Fatal("the fenced member's subscription closed with the stop off: no control")
	}
	if n := first.Load(); n != 0 {
		t.Fatalf("the fenced member reported %d times with the stop off", n)
	}
	v := describeGroup(t, admin, staticGroup)
	if len(v.members) != 1 {
		t.Fatalf("group %v: want the second member alone", v)
	}
	t.Logf("with the stop off the fenced member's subscription stays open and nothing reports it; group: %v", v)
}
