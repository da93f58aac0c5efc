package kafkagroup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/internal/promset"
)

// DefaultStallAfter is how long a partition of a consumer's Stable group
// may stay behind its high-water mark with an unchanged committed offset
// before the Kafka subscriber re-joins the group (see groupSubscriber). It is well
// above what a member's death costs the group (the 6 s session timeout,
// then a rebalance of at most Rebalance.Timeout), so an ordinary failover
// never triggers it.
const DefaultStallAfter = 30 * time.Second

// RejoinLogMessage is the message of the error logged each time a consumer
// re-joins its stalled group; the fault suite counts these lines.
const RejoinLogMessage = "Kafka consumer group stalled; re-joining the group"

// groupSubscriber is the Kafka subscriber of one consumer group with a
// liveness watchdog: a group can look healthy to the broker and to every
// live member while one of its partitions is never delivered, and no
// client-side timeout ends that.
//
// Seen in the fault suite over kfake: a consumer SIGKILLed while its
// JoinGroup waited for a rebalance stayed in the group as a member without
// a session timer (kfake arms it when it hands a join or sync response to
// the member's connection, and for a connection already closed that
// hand-over is a coin toss between the closed connection and room in its
// response buffer), the leader assigned it partitions, and the group
// stayed Stable with those partitions unread for as long as no other
// member joined or left. A member whose partition consumer or handler is
// stuck looks the same from outside.
//
// So for every subscribed topic the subscriber polls the group's state,
// its committed offsets and the partitions' high-water marks (every
// stallAfter/5, from one rebalance timeout after it joined). When the group
// has been Stable and a partition behind with the same committed offset
// for stallAfter, whoever holds it, this instance re-joins: it subscribes
// anew (a fresh member, whose JoinGroup starts a rebalance in which members
// that do not re-join in time are dropped) and closes the old subscriber
// (its member leaves the group). Messages the old subscriber delivered and
// that were not yet acknowledged are delivered again; the inbox absorbs
// the repeats.
type groupSubscriber struct {
	brokers    []string
	group      string
	config     *sarama.Config
	logger     watermill.LoggerAdapter
	stallAfter time.Duration
	rejoins    prometheus.Counter // nil: not counted
	inFlight   int                // per partition; 0: DefaultInFlight
	// instanceID is Options.InstanceID: "" for dynamic members.
	instanceID string
	fenced     func(error)

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu   sync.Mutex
	subs map[*member]struct{} // every member not yet closed
}

// newGroupSubscriber reads opts' Logger, StallAfter, InstanceID and Fenced.
func newGroupSubscriber(brokers []string, group string, config *sarama.Config, opts Options, rejoins prometheus.Counter) *groupSubscriber {
	stallAfter := opts.StallAfter
	if stallAfter <= 0 {
		stallAfter = DefaultStallAfter
	}
	return &groupSubscriber{brokers: brokers, group: group, config: config, logger: opts.Logger, stallAfter: stallAfter,
		rejoins: rejoins, instanceID: opts.InstanceID, fenced: opts.Fenced, closing: make(chan struct{}), subs: make(map[*member]struct{})}
}

// memberInstance is the static member instance ID of topic's member, ""
// for a dynamic member. A consumer reads each topic with a member of its
// own in the same group, so the topic tells them apart.
func (s *groupSubscriber) memberInstance(topic string) string {
	if s.instanceID == "" {
		return ""
	}
	return s.instanceID + "." + topic
}

// Subscribe joins the group on topic and watches it until ctx ends or the
// subscriber is closed.
func (s *groupSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	// Counted before Close can start waiting (it closes closing under mu).
	s.mu.Lock()
	if isDone(s.closing) {
		s.mu.Unlock()
		return nil, errClosed
	}
	s.wg.Add(2)
	s.mu.Unlock()
	inner, in, err := s.join(ctx, topic)
	if err != nil {
		s.wg.Add(-2)
		return nil, err
	}
	out := make(chan *message.Message)
	stalled := make(chan struct{}, 1)
	go s.watch(ctx, topic, stalled)
	go s.forward(ctx, topic, inner, in, out, stalled)
	return out, nil
}

var errClosed = errors.New("kafka subscriber closed")

// join subscribes a new Kafka subscriber, that is a new group member.
func (s *groupSubscriber) join(ctx context.Context, topic string) (*member, <-chan *message.Message, error) {
	config := s.config
	if id := s.memberInstance(topic); id != "" {
		c := *s.config
		c.Consumer.Group.InstanceId = id
		config = &c
	}
	k := newMember(s.brokers, s.group, config, s.logger, s.inFlight, s.fenced)
	ch, err := k.Subscribe(ctx, topic)
	if err != nil {
		_ = k.Close()
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if isDone(s.closing) {
		_ = k.Close()
		return nil, nil, errClosed
	}
	s.subs[k] = struct{}{}
	return k, ch, nil
}

// forward passes the current member's messages on to out and, when watch
// reports a stall, replaces the member.
func (s *groupSubscriber) forward(ctx context.Context, topic string, inner *member, in <-chan *message.Message, out chan<- *message.Message, stalled <-chan struct{}) {
	defer s.wg.Done()
	defer close(out)
	for {
		select {
		case m, ok := <-in:
			if !ok {
				return // ctx ended or Close: the member closed its channel
			}
			select {
			case out <- m:
				continue
			case <-stalled:
				// m stays unacknowledged; the group delivers it again.
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			}
		case <-stalled:
		case <-s.closing:
			return
		}
		var ok bool
		if inner, in, ok = s.rejoin(ctx, topic, inner, in); !ok {
			return
		}
	}
}

// rejoin replaces the member inner (delivering on in) with a new one and
// returns it, or the old one if a dynamic re-join failed (watch reports
// the stall again); ok is false once the subscriber is done.
func (s *groupSubscriber) rejoin(ctx context.Context, topic string, inner *member, in <-chan *message.Message) (_ *member, _ <-chan *message.Message, ok bool) {
	fields := watermill.LogFields{"consumer_group": s.group, "topic": topic}
	if s.instanceID == "" {
		// The new member first, then the old one leaves.
		next, nextIn, err := s.join(ctx, topic)
		if errors.Is(err, errClosed) {
			return nil, nil, false
		}
		if err != nil {
			s.logger.Error("Cannot re-join stalled Kafka consumer group", err, fields)
			return inner, in, true
		}
		s.retire(inner)
		return next, nextIn, true
	}
	// A static member that joins again under its own instance ID takes its
	// old assignment back without a rebalance (and fences the old member):
	// the rebalance the re-join is for needs the old member stopped and
	// removed by its instance ID first, and then a join that succeeds.
	inner.stop()
	s.retire(inner)
	if err := s.leave(topic); err != nil {
		s.logger.Error("Cannot remove the static member of a stalled Kafka consumer group", err, fields)
	}
	for {
		next, nextIn, err := s.join(ctx, topic)
		if err == nil {
			return next, nextIn, true
		}
		if errors.Is(err, errClosed) {
			return nil, nil, false
		}
		s.logger.Error("Cannot re-join stalled Kafka consumer group; trying again", err, fields)
		if !pause(ctx, s.closing, reconsumeSleep) {
			return nil, nil, false
		}
	}
}

// leave removes topic's static member from the group by its instance ID
// (LeaveGroup v3, which sarama sends from version 2.4), which starts a
// rebalance.
func (s *groupSubscriber) leave(topic string) error {
	config := *s.config
	config.Version = sarama.V2_4_0_0
	client, err := sarama.NewClient(s.brokers, &config)
	if err != nil {
		return err
	}
	defer client.Close()
	coordinator, err := client.Coordinator(s.group)
	if err != nil {
		return err
	}
	id := s.memberInstance(topic)
	resp, err := coordinator.LeaveGroup(&sarama.LeaveGroupRequest{Version: 3, GroupId: s.group,
		Members: []sarama.MemberIdentity{{GroupInstanceId: &id}}})
	if err != nil {
		return err
	}
	if resp.Err != sarama.ErrNoError {
		return resp.Err
	}
	for _, m := range resp.Members {
		if m.Err != sarama.ErrNoError && m.Err != sarama.ErrUnknownMemberId {
			return m.Err
		}
	}
	return nil
}

// retire closes a replaced member in the background: its session waits
// for its claims to end, and a stuck one must not keep the new member from
// delivering.
func (s *groupSubscriber) retire(k *member) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := k.Close(); err != nil {
			s.logger.Error("Cannot close replaced Kafka subscriber", err, watermill.LogFields{"consumer_group": s.group})
		}
		s.mu.Lock()
		delete(s.subs, k)
		s.mu.Unlock()
	}()
}

type partitionSeen struct {
	committed int64
	since     time.Time
}

// watch polls the group's offsets on topic and signals stalled when a
// partition has been behind with the same committed offset for stallAfter.
func (s *groupSubscriber) watch(ctx context.Context, topic string, stalled chan<- struct{}) {
	defer s.wg.Done()
	seen := map[int32]partitionSeen{}
	// A (re)join starts a rebalance, which may take the whole rebalance
	// timeout (it waits for members that do not re-join): nothing is
	// judged before it could be over. A re-join during a rebalance would
	// restart it (the broker resets its timer on every JoinGroup), and
	// re-joining at every check would keep the group rebalancing for good.
	settled := time.Now().Add(s.config.Consumer.Group.Rebalance.Timeout)
	every(ctx, s.closing, s.stallAfter/5, func() {
		if time.Now().Before(settled) {
			return
		}
		state, committed, hwm, err := s.offsets(topic)
		if err != nil || state != "Stable" {
			// The broker may be restarting, and nothing is committed while
			// it is away; a rebalancing group commits nothing either, and
			// one more join would only restart its rebalance (kfake resets
			// the rebalance timer on every JoinGroup, so under a stream of
			// member restarts a group can rebalance for minutes). Count
			// again once the group is Stable: a stall is a partition left
			// unread by a group that has settled.
			clear(seen)
			return
		}
		now := time.Now()
		var stuck []string
		for p, h := range hwm {
			c, ok := committed[p]
			if !ok {
				c = -1
			}
			prev, known := seen[p]
			if !known || prev.committed != c || h <= max(c, 0) {
				seen[p] = partitionSeen{committed: c, since: now}
				continue
			}
			if d := now.Sub(prev.since); d >= s.stallAfter {
				stuck = append(stuck, fmt.Sprintf("%d (committed %d, high-water mark %d, for %s)", p, c, h, d.Round(time.Second)))
			}
		}
		if len(stuck) == 0 {
			return
		}
		sort.Strings(stuck)
		s.logger.Error(RejoinLogMessage, fmt.Errorf("partitions behind the high-water mark with no commit: %s", strings.Join(stuck, ", ")),
			watermill.LogFields{"consumer_group": s.group, "topic": topic, "stall_after": s.stallAfter.String()})
		if s.rejoins != nil {
			s.rejoins.Inc()
		}
		select {
		case stalled <- struct{}{}:
		default:
		}
		clear(seen)
		settled = time.Now().Add(s.config.Consumer.Group.Rebalance.Timeout)
	})
}

// every calls check every interval until ctx ends or stop is closed: the
// polling of the watchdog and of the lag measurement.
func every(ctx context.Context, stop <-chan struct{}, interval time.Duration, check func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
		}
		check()
	}
}

// offsets returns the group's state (Stable, PreparingRebalance, …), its
// committed offset (-1: none) and the high-water mark of every partition
// of topic. A client of its own per call, so a broker restart costs no
// state.
func (s *groupSubscriber) offsets(topic string) (state string, committed, hwm map[int32]int64, err error) {
	client, err := sarama.NewClient(s.brokers, s.config)
	if err != nil {
		return "", nil, nil, err
	}
	defer client.Close()
	hwm, err = highWaterMarks(client, topic)
	if err != nil {
		return "", nil, nil, err
	}
	parts := make([]int32, 0, len(hwm))
	for p := range hwm {
		parts = append(parts, p)
	}
	coordinator, err := client.Coordinator(s.group)
	if err != nil {
		return "", nil, nil, err
	}
	desc, err := coordinator.DescribeGroups(&sarama.DescribeGroupsRequest{Groups: []string{s.group}})
	if err != nil {
		return "", nil, nil, err
	}
	if len(desc.Groups) != 1 || desc.Groups[0].Err != sarama.ErrNoError {
		return "", nil, nil, fmt.Errorf("describe group %s: %+v", s.group, desc.Groups)
	}
	resp, err := coordinator.FetchOffset(sarama.NewOffsetFetchRequest(s.config.Version, s.group, map[string][]int32{topic: parts}))
	if err != nil {
		return "", nil, nil, err
	}
	if resp.Err != sarama.ErrNoError {
		return "", nil, nil, resp.Err
	}
	committed = make(map[int32]int64, len(parts))
	for _, p := range parts {
		b := resp.GetBlock(topic, p)
		if b == nil {
			return "", nil, nil, fmt.Errorf("offset fetch of group %s: no answer for %s/%d", s.group, topic, p)
		}
		if b.Err != sarama.ErrNoError {
			return "", nil, nil, b.Err
		}
		committed[p] = b.Offset
	}
	return desc.Groups[0].State, committed, hwm, nil
}

// PartitionOffset returns the high-water mark of every partition of topic.
func (s *groupSubscriber) PartitionOffset(topic string) (map[int32]int64, error) {
	client, err := sarama.NewClient(s.brokers, s.config)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	return highWaterMarks(client, topic)
}

func highWaterMarks(client sarama.Client, topic string) (map[int32]int64, error) {
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	hwm := make(map[int32]int64, len(parts))
	for _, p := range parts {
		o, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, err
		}
		hwm[p] = o
	}
	return hwm, nil
}

// Close closes every member and waits for the watchers and forwarders.
func (s *groupSubscriber) Close() error {
	s.mu.Lock()
	s.closeOnce.Do(func() { close(s.closing) })
	subs := slices.Collect(maps.Keys(s.subs))
	s.mu.Unlock()
	return closeAll(subs, &s.wg)
}

// rejoinCounter is posthorn_consumer_group_rejoins_total of reg.
func rejoinCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	return promset.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "posthorn_consumer_group_rejoins_total",
		Help: "Times a Kafka consumer re-joined its group because a partition stayed behind with no commit for the stall time.",
	}, []string{"consumer"}))
}
