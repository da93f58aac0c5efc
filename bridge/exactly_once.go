package bridge

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/posthorn/posthorn/core"
)

// FencedSink is a sink that publishes each shard's records in transactions
// a lease fences (the Kafka sink in exactly-once mode): with it, a reader
// that sees only committed records receives every event once, even when a
// relay crashes between the sink's ACK and the marker. The relay Fences a
// shard before it publishes for it, marks the rows the shard's committed
// transactions hold, and publishes a batch with PublishShard per shard.
type FencedSink interface {
	core.Sink
	// Fence makes the caller the shard's only producer (an earlier owner
	// can no longer commit) and returns the outbox ids of the shard's
	// newest committed transaction: every committed row of the shard whose
	// marker may be missing.
	Fence(ctx context.Context, shard int) ([]int64, error)
	// PublishShard publishes batch, all of one shard, in one transaction
	// that also records ids as the shard's newest committed rows. On an
	// error nothing of it is committed, or the outcome is unknown; the
	// shard must be fenced again before its next publish.
	PublishShard(ctx context.Context, shard int, batch []core.Envelope, ids []int64) error
	// Unfence closes the shard's producer (its lease was given back or
	// lost).
	Unfence(shard int)
}

// syncFences keeps the fences in step with the leases after a lease round
// trip: a shard leased anew (or under a new token) waits for its fence, a
// shard no longer leased is unfenced.
func (r *Relay) syncFences(before []core.Lease) {
	if r.fenced == nil {
		return
	}
	for _, l := range before {
		if !slices.Contains(r.leases, l) {
			r.fenced.Unfence(l.Shard)
			delete(r.unfenced, l.Shard)
		}
	}
	for _, l := range r.leases {
		if !slices.Contains(before, l) {
			r.unfenced[l.Shard] = true
		}
	}
}

// errLeaseDue ends a fence round whose leases must be renewed first.
var errLeaseDue = errors.New("leases due for renewal")

// fence fences every held shard that waits for it, in parallel, and marks
// the rows their committed transactions hold, so nothing already committed
// is sent again (after a crash, a takeover, a lost commit response or a
// failed marker). Until every held shard is fenced nothing is published.
// It returns errLeaseDue when the leases are about to expire (the caller
// renews them at once), else the first failure.
func (r *Relay) fence(ctx context.Context) error {
	if time.Until(r.deadline) < r.cfg.LeaseTTL/10 {
		r.nextMaintain = time.Time{}
		return errLeaseDue
	}
	shards := slices.Sorted(maps.Keys(r.unfenced))
	ids := make([][]int64, len(shards))
	errs := make([]error, len(shards))
	fctx, cancel := context.WithDeadline(ctx, r.deadline)
	var wg sync.WaitGroup
	for k, shard := range shards {
		wg.Go(func() { ids[k], errs[k] = r.fenced.Fence(fctx, shard) })
	}
	wg.Wait()
	cancel()
	var refs []core.RowRef
	var fenced []int
	var first error
	for k, shard := range shards {
		if errs[k] != nil {
			if ctx.Err() == nil {
				r.log.Error("fence shard for exactly-once", "shard", shard, "err", errs[k])
			}
			first = cmp.Or(first, errs[k])
			continue
		}
		if h := r.cfg.Hooks; h == nil || !h.UnsafeSkipPositions {
			for _, id := range ids[k] {
				refs = append(refs, core.RowRef{ID: id, Shard: shard})
			}
		}
		fenced = append(fenced, shard)
	}
	if len(fenced) == 0 {
		return first
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
	for _, shard := range fenced {
		delete(r.unfenced, shard)
	}
	r.log.Info("shards fenced for exactly-once", "shards", fenced, "committed_rows", len(refs), "newly_marked", marked)
	return first
}

// publishFenced publishes batch (rows' envelopes) with one transaction per
// shard, in parallel. Each shard's transaction records its rows' ids and
// those of carry (the marker still in flight) of the same shard. A shard
// whose publish failed waits for a new fence.
func (r *Relay) publishFenced(ctx context.Context, rows []core.OutboxRow, batch []core.Envelope, carry []core.RowRef) error {
	byShard := map[int][]int{}
	for i, row := range rows {
		byShard[row.Shard] = append(byShard[row.Shard], i)
	}
	shards := slices.Sorted(maps.Keys(byShard))
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for k, shard := range shards {
		idx := byShard[shard]
		envs := make([]core.Envelope, len(idx))
		var ids []int64
		for j, i := range idx {
			envs[j] = batch[i]
			ids = append(ids, rows[i].ID)
		}
		for _, c := range carry {
			if c.Shard == shard {
				ids = append(ids, c.ID)
			}
		}
		wg.Go(func() { errs[k] = r.fenced.PublishShard(ctx, shard, envs, ids) })
	}
	wg.Wait()
	failed := map[int]error{}
	for k, err := range errs {
		if err == nil {
			continue
		}
		idx := byShard[shards[k]]
		r.unfenced[shards[k]] = true
		var be *core.BatchError
		if !errors.As(err, &be) {
			for _, i := range idx {
				failed[i] = err
			}
			continue
		}
		for j, ferr := range be.Failed {
			failed[idx[j]] = ferr
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &core.BatchError{Failed: failed}
}
