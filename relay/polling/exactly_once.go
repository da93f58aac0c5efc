package polling

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/posthorn/posthorn/core"
)

// This file is the polling relay's side of exactly-once (Settings.ExactlyOnce,
// relay/internal/delivery): the fences follow the leases, and a lease round trip or a
// failure is followed by a fence before anything is published.

// syncFences keeps the fences in step with the leases after a lease round
// trip: a shard leased anew (or under a new token) waits for its fence, a
// shard no longer leased is dropped.
func (r *Relay) syncFences(before []core.Lease) {
	if r.fences == nil {
		return
	}
	for _, l := range before {
		if !slices.Contains(r.leases, l) {
			r.fences.Drop(l.Shard)
		}
	}
	for _, l := range r.leases {
		if !slices.Contains(before, l) {
			r.fences.Need(l.Shard)
		}
	}
}

// errLeaseDue ends a fence round whose leases must be renewed first.
var errLeaseDue = errors.New("leases due for renewal")

// fence fences every held shard that waits for it and marks the rows their
// committed transactions hold, so nothing already committed is sent again
// (after a crash, a takeover, a lost commit response or a failed marker).
// Until every held shard is fenced nothing is published. It returns
// errLeaseDue when the leases are about to expire (the caller renews them
// at once), else the first failure.
//
// A fence gives up a quarter of the lease before it ends: a fence that
// waits on a transaction coordinator out of reach must leave the relay the
// time to renew its leases, or they lapse, the other relay takes them over
// and meets the same coordinator, and the two hand the shards back and
// forth while nothing is published.
func (r *Relay) fence(ctx context.Context) error {
	end := r.deadline.Add(-r.cfg.LeaseTTL / 4)
	if time.Until(end) <= 0 {
		r.nextMaintain = time.Time{}
		return errLeaseDue
	}
	refs, fenced, ferr := r.fences.Fence(ctx, end)
	if ferr != nil && ctx.Err() == nil {
		r.log.Error("fence shards for exactly-once", "fenced", fenced, "err", ferr)
	}
	if len(fenced) == 0 {
		return ferr
	}
	// Most of these rows were marked already; MarkRelayed counts those with
	// the rows of a lease lost meanwhile as not marked, so the count says
	// nothing here. A lost lease shows at the next renewal, and until then
	// the new owner's fence keeps this relay's transactions from committing.
	marked, _, err := r.store.MarkRelayed(ctx, refs, r.leases)
	if err != nil {
		r.log.Error("mark the rows committed transactions hold", "shards", fenced, "rows", len(refs), "err", err)
		return err
	}
	r.fences.Done(fenced)
	r.log.Info("shards fenced for exactly-once", "shards", fenced, "committed_rows", len(refs), "newly_marked", marked)
	return ferr
}
