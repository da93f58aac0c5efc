package faultkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
)

// MoveKafkaLeaders moves the leader of every partition of the event topic
// on a real Kafka cluster: each partition's replica list is rotated by one
// (the same replicas, so no data moves; its first, the preferred leader, is
// the next replica), then the preferred replicas are elected. A partition
// whose new preferred replica is not in sync keeps its leader (the next
// move may take it); that is no error.
func MoveKafkaLeaders(ctx context.Context, brokers []string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// Early in a run the relay may not have created the topic yet.
	var td kadm.TopicDetail
	for {
		topics, err := adm.ListTopics(ctx, core.TopicEvents)
		if err != nil {
			return fmt.Errorf("move leaders: describe %s: %w", core.TopicEvents, err)
		}
		td = topics[core.TopicEvents]
		if !errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("move leaders: describe %s: %w (%w)", core.TopicEvents, td.Err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	if td.Err != nil {
		return fmt.Errorf("move leaders: describe %s: %w", core.TopicEvents, td.Err)
	}
	var req kadm.AlterPartitionAssignmentsReq
	parts := make([]int32, 0, len(td.Partitions))
	for p, pd := range td.Partitions {
		if len(pd.Replicas) < 2 {
			return fmt.Errorf("move leaders: %s/%d has %d replica", core.TopicEvents, p, len(pd.Replicas))
		}
		req.Assign(core.TopicEvents, p, append(slices.Clone(pd.Replicas[1:]), pd.Replicas[0]))
		parts = append(parts, p)
	}
	// The request goes to a node a concurrent broker outage may be killing
	// at that moment; the same reassignment asked again is harmless, so a
	// request that failed is asked again until ctx ends.
	var resps kadm.AlterPartitionAssignmentsResponses
	for {
		resps, err = adm.AlterPartitionAssignments(ctx, req)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("move leaders: reassign: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := resps.Error(); err != nil {
		return fmt.Errorf("move leaders: reassign: %w", err)
	}
	res, err := adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, kadm.TopicsSet{core.TopicEvents: setOf(parts)})
	if err != nil {
		return fmt.Errorf("move leaders: elect: %w", err)
	}
	var errs []error
	for _, ps := range res {
		for p, r := range ps {
			if r.Err != nil && !errors.Is(r.Err, kerr.ElectionNotNeeded) && !errors.Is(r.Err, kerr.PreferredLeaderNotAvailable) {
				errs = append(errs, fmt.Errorf("move leaders: elect %s/%d: %w", core.TopicEvents, p, r.Err))
			}
		}
	}
	return errors.Join(errs...)
}

func setOf(ps []int32) map[int32]struct{} {
	m := make(map[int32]struct{}, len(ps))
	for _, p := range ps {
		m[p] = struct{}{}
	}
	return m
}
