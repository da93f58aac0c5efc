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

// RelayReport is the ledger's view of the relays: each shard's lease
// (owner, fencing token, expiry against now) with its unrelayed rows (how
// many, the oldest id and age, a few aggregates), the live relays and the
// parked aggregates. It is what the suite prints when the relays stall.
func (s *System) RelayReport(ctx context.Context) (string, error) {
	var b strings.Builder
	rows, err := s.Ledger.Query(ctx, `
		SELECT l.shard, coalesce(l.owner, '-'), l.token, l.expires_at > now(),
		       CASE WHEN isfinite(l.expires_at) THEN 'expires in ' || round(extract(epoch FROM l.expires_at - now())::numeric, 1) || 's' ELSE 'never granted' END,
		       count(o.id), coalesce(min(o.id), 0), coalesce(round(extract(epoch FROM now() - min(o.created_at))::numeric, 1)::text, '-'),
		       coalesce((array_agg(DISTINCT o.aggregate_id))[1:3]::text, '{}')
		FROM relay_leases l LEFT JOIN outbox_pending p ON p.shard = l.shard LEFT JOIN outbox o ON o.id = p.id
		GROUP BY l.shard, l.owner, l.token, l.expires_at ORDER BY l.shard`)
	if err != nil {
		return "", fmt.Errorf("relay leases: %w", err)
	}
	for rows.Next() {
		var shard int
		var owner, expiry, oldestAge, aggs string
		var token, unrelayed, oldest int64
		var live bool
		if err := rows.Scan(&shard, &owner, &token, &live, &expiry, &unrelayed, &oldest, &oldestAge, &aggs); err != nil {
			rows.Close()
			return "", fmt.Errorf("relay leases: %w", err)
		}
		fmt.Fprintf(&b, "  shard %2d: owner %s, token %d, live %v (%s); unrelayed %d", shard, owner, token, live, expiry, unrelayed)
		if unrelayed > 0 {
			fmt.Fprintf(&b, ", oldest id %d committed %ss ago, aggregates %s", oldest, oldestAge, aggs)
		}
		b.WriteString("\n")
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("relay leases: %w", err)
	}
	var members, parked string
	if err := s.Ledger.QueryRow(ctx, `
		SELECT (SELECT coalesce(string_agg(owner || ' seen ' || round(extract(epoch FROM now() - seen_at)::numeric, 1) || 's ago', ', '), 'none') FROM relay_members),
		       (SELECT coalesce(string_agg(aggregate_type || ' ' || aggregate_id || ': ' || reason, '; '), 'none') FROM relay_parked)`).Scan(&members, &parked); err != nil {
		return "", fmt.Errorf("relay members: %w", err)
	}
	fmt.Fprintf(&b, "  live relays: %s\n  parked aggregates: %s\n", members, parked)
	return b.String(), nil
}
