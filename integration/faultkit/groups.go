package faultkit

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/posthorn/posthorn/core"
)

// GroupReport asks the broker how it sees the consumer groups: each group's
// state and generation-independent membership, and per partition of the
// event topic the member it is assigned to, the group's committed offset,
// the high-water mark and the difference. It is what the suite prints when
// consumers stall, to tell a member that holds partitions it does not read
// from a group that lost its members.
func (s *System) GroupReport(ctx context.Context, groups []string) (string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.BrokerAddr))
	if err != nil {
		return "", fmt.Errorf("broker client: %w", err)
	}
	defer cl.Close()

	lo := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = core.TopicEvents
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(core.TopicEvents)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		return "", fmt.Errorf("metadata: %w", err)
	}
	for _, t := range mresp.Topics {
		for _, p := range t.Partitions {
			lp := kmsg.NewListOffsetsRequestTopicPartition()
			lp.Partition = p.Partition
			lp.Timestamp = -1 // the high-water mark
			lt.Partitions = append(lt.Partitions, lp)
		}
	}
	lo.Topics = append(lo.Topics, lt)
	loresp, err := lo.RequestWith(ctx, cl)
	if err != nil {
		return "", fmt.Errorf("list offsets: %w", err)
	}
	hwm := map[int32]int64{}
	for _, t := range loresp.Topics {
		for _, p := range t.Partitions {
			hwm[p.Partition] = p.Offset
		}
	}

	dg := kmsg.NewPtrDescribeGroupsRequest()
	dg.Groups = groups
	dgresp, err := dg.RequestWith(ctx, cl)
	if err != nil {
		return "", fmt.Errorf("describe groups: %w", err)
	}
	var b strings.Builder
	for _, g := range dgresp.Groups {
		fmt.Fprintf(&b, "group %s: state %s, %d member(s)\n", g.Group, g.State, len(g.Members))
		owner := map[int32]string{}
		for _, m := range g.Members {
			var a kmsg.ConsumerMemberAssignment
			_ = a.ReadFrom(m.MemberAssignment)
			var parts []string
			for _, t := range a.Topics {
				for _, p := range t.Partitions {
					owner[p] = m.ClientHost
					parts = append(parts, fmt.Sprint(p))
				}
			}
			fmt.Fprintf(&b, "  member %s from %s: partitions [%s]\n", m.MemberID, m.ClientHost, strings.Join(parts, " "))
		}
		of := kmsg.NewPtrOffsetFetchRequest()
		of.Group = g.Group
		ofresp, err := of.RequestWith(ctx, cl)
		if err != nil {
			return b.String(), fmt.Errorf("offset fetch of %s: %w", g.Group, err)
		}
		committed := map[int32]int64{}
		for _, t := range ofresp.Topics {
			if t.Topic != core.TopicEvents {
				continue
			}
			for _, p := range t.Partitions {
				committed[p.Partition] = p.Offset
			}
		}
		for _, og := range ofresp.Groups {
			for _, t := range og.Topics {
				if t.Topic != core.TopicEvents {
					continue
				}
				for _, p := range t.Partitions {
					committed[p.Partition] = p.Offset
				}
			}
		}
		parts := make([]int32, 0, len(hwm))
		for p := range hwm {
			parts = append(parts, p)
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
		for _, p := range parts {
			c, ok := committed[p]
			if !ok {
				c = -1
			}
			o := owner[p]
			if o == "" {
				o = "nobody"
			}
			fmt.Fprintf(&b, "  partition %d: committed %d, high-water mark %d, behind %d, assigned to %s\n", p, c, hwm[p], hwm[p]-max(c, 0), o)
		}
	}
	return b.String(), nil
}
