package polling

import (
	"context"
	"slices"
	"time"

	"github.com/posthorn/posthorn/core"
)

// This file keeps the polling relay's shard leases: heartbeat, renewal,
// takeover and the even share between live relays.

// maintainLeases heartbeats, renews the held leases, and takes or gives
// back shards so that live relays share them evenly.
func (r *Relay) maintainLeases(ctx context.Context) {
	ttl := r.cfg.LeaseTTL
	sent := time.Now()
	defer r.syncFences(slices.Clone(r.leases))
	r.nextMaintain = sent.Add(ttl / 4)
	fail := func(what string, err error) {
		if ctx.Err() != nil {
			return
		}
		r.log.Error(what, "err", err)
		r.life.SetReady(err)
		r.nextMaintain = sent.Add(min(ttl/4, time.Second))
	}
	live, err := r.store.Heartbeat(ctx, r.cfg.Owner, ttl)
	if err != nil {
		fail("relay heartbeat", err)
		return
	}
	renewed, err := r.store.RenewLeases(ctx, r.cfg.Owner, r.leases, ttl)
	if err != nil {
		fail("renew leases", err)
		return
	}
	if len(renewed) < len(r.leases) {
		r.log.Warn("leases lost (expired and taken over)", "held", leaseShards(r.leases), "kept", leaseShards(renewed))
	}
	r.leases = renewed
	target := (core.Shards + live - 1) / live
	switch {
	case len(r.leases) > target:
		slices.SortFunc(r.leases, func(a, b core.Lease) int { return a.Shard - b.Shard })
		extra := r.leases[target:]
		if err := r.store.ReleaseLeases(ctx, r.cfg.Owner, extra); err != nil {
			fail("release extra leases", err)
		} else {
			r.log.Info("released shards for another relay", "shards", leaseShards(extra), "live_relays", live)
			r.leases = r.leases[:target:target]
		}
	case len(r.leases) < target:
		got, err := r.store.AcquireLeases(ctx, r.cfg.Owner, target-len(r.leases), leaseShards(r.leases), ttl)
		if err != nil {
			fail("acquire leases", err)
			break
		}
		for _, l := range got {
			if l.PreviousOwner != "" {
				r.m.Takeovers.Inc()
				r.log.Warn("lease taken over from a relay that stopped renewing", "shard", l.Shard, "previous_owner", l.PreviousOwner)
			}
		}
		if len(got) > 0 {
			r.log.Info("acquired shards", "shards", leaseShards(got), "live_relays", live)
		}
		r.leases = append(r.leases, got...)
	}
	slices.SortFunc(r.leases, func(a, b core.Lease) int { return a.Shard - b.Shard })
	r.deadline = sent.Add(ttl)
	r.m.ShardsOwned.Set(float64(len(r.leases)))
	r.life.SetReady(nil)
}
