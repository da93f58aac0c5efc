package delivery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
)

// ErrNotFenced is returned by NewFences for a sink that is not a
// FencedSink.
var ErrNotFenced = errors.New("ExactlyOnce needs a sink that publishes in fenced transactions")

// Fences is the exactly-once state a relay (polling or CDC) keeps over a
// FencedSink: which shards wait for a fence before anything of theirs is
// published. It is owned by one goroutine, the relay's loop.
type Fences struct {
	sink     relay.FencedSink
	unfenced map[int]bool
	// skipPositions is the negative control's hook (UnsafeSkipPositions).
	skipPositions bool
}

// NewFences returns the fences over sink, which must be a FencedSink.
// skipPositions, for negative controls only, fences without returning what
// the committed transactions hold.
func NewFences(sink core.Sink, skipPositions bool) (*Fences, error) {
	fs, ok := sink.(relay.FencedSink)
	if !ok {
		return nil, fmt.Errorf("%w, not %T", ErrNotFenced, sink)
	}
	return &Fences{sink: fs, unfenced: map[int]bool{}, skipPositions: skipPositions}, nil
}

// Need makes shards wait for a fence: leased anew, or their publish or
// marker failed.
func (f *Fences) Need(shards ...int) {
	for _, s := range shards {
		f.unfenced[s] = true
	}
}

// Pending reports whether a shard waits for its fence.
func (f *Fences) Pending() bool { return len(f.unfenced) > 0 }

// Drop closes shard's producer: its lease was given back or lost.
func (f *Fences) Drop(shard int) {
	f.sink.Unfence(shard)
	delete(f.unfenced, shard)
}

// Fence fences every shard that waits for it, in parallel, within
// deadline, and returns the rows their newest committed transactions hold
// with the shards it fenced. The caller marks those rows relayed and then
// calls Done(fenced): until then the shards still wait, so nothing of them
// is published before the rows already committed are marked. A shard whose
// fence failed keeps waiting; err is the first failure.
func (f *Fences) Fence(ctx context.Context, deadline time.Time) (refs []core.RowRef, fenced []int, err error) {
	shards := slices.Sorted(maps.Keys(f.unfenced))
	ids := make([][]int64, len(shards))
	errs := make([]error, len(shards))
	fctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var wg sync.WaitGroup
	for k, shard := range shards {
		wg.Go(func() { ids[k], errs[k] = f.sink.Fence(fctx, shard) })
	}
	wg.Wait()
	for k, shard := range shards {
		if errs[k] != nil {
			err = errors.Join(err, errs[k])
			continue
		}
		if !f.skipPositions {
			for _, id := range ids[k] {
				refs = append(refs, core.RowRef{ID: id, Shard: shard})
			}
		}
		fenced = append(fenced, shard)
	}
	return refs, fenced, err
}

// Done records shards as fenced, once the rows Fence returned for them are
// marked.
func (f *Fences) Done(shards []int) {
	for _, s := range shards {
		delete(f.unfenced, s)
	}
}

// Publish publishes batch (rows' envelopes) with one transaction per shard,
// in parallel. Each shard's transaction records its rows' ids and those of
// carry (a marker still in flight) of the same shard. A shard whose publish
// failed waits for a new fence.
func (f *Fences) Publish(ctx context.Context, rows []core.OutboxRow, batch []core.Envelope, carry []core.RowRef) error {
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
		wg.Go(func() { errs[k] = f.sink.PublishShard(ctx, shard, envs, ids) })
	}
	wg.Wait()
	failed := map[int]error{}
	for k, err := range errs {
		if err == nil {
			continue
		}
		idx := byShard[shards[k]]
		f.Need(shards[k])
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
