package relay

import (
	"context"

	"github.com/posthorn/posthorn/core"
)

// FencedSink is a sink that publishes each shard's records in transactions
// a lease fences (the Kafka sink in exactly-once mode): with it, a reader
// that sees only committed records receives every event once, even when a
// relay crashes between the sink's ACK and the marker. A relay Fences a
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
	// that also records the shard's newest committed rows: ids[i] is the
	// row of batch[i], and the ids after len(batch) are rows of earlier
	// transactions whose markers are still in flight. Only the rows whose
	// records the transaction holds are recorded. On an error nothing of it
	// is committed, or the outcome is unknown; the shard must be fenced
	// again before its next publish.
	PublishShard(ctx context.Context, shard int, batch []core.Envelope, ids []int64) error
	// Unfence closes the shard's producer (its lease was given back or
	// lost).
	Unfence(shard int)
}

// PublishFunc publishes one batch: a sink's Publish, or a FencedSink's
// PublishShard bound to its shard and positions.
type PublishFunc func(ctx context.Context, batch []core.Envelope) error

// Around runs one publish of batch: it may change the envelopes (one for
// one, in order, so that a *core.BatchError's indexes still name them) and
// must return what publish returns.
type Around func(ctx context.Context, batch []core.Envelope, publish PublishFunc) error

// Wrap returns sink with every publish going through around, Publish and,
// when sink is a FencedSink, PublishShard: a wrapped sink stays fenced, so
// exactly-once mode keeps working under a wire format or tracing.
func Wrap(sink core.Sink, around Around) core.Sink {
	w := wrapped{Sink: sink, around: around}
	if fs, ok := sink.(FencedSink); ok {
		return wrappedFenced{wrapped: w, fenced: fs}
	}
	return w
}

type wrapped struct {
	core.Sink
	around Around
}

func (w wrapped) Publish(ctx context.Context, batch []core.Envelope) error {
	return w.around(ctx, batch, w.Sink.Publish)
}

type wrappedFenced struct {
	wrapped
	fenced FencedSink
}

func (w wrappedFenced) Fence(ctx context.Context, shard int) ([]int64, error) {
	return w.fenced.Fence(ctx, shard)
}

func (w wrappedFenced) PublishShard(ctx context.Context, shard int, batch []core.Envelope, ids []int64) error {
	return w.around(ctx, batch, func(ctx context.Context, batch []core.Envelope) error {
		return w.fenced.PublishShard(ctx, shard, batch, ids)
	})
}

func (w wrappedFenced) Unfence(shard int) { w.fenced.Unfence(shard) }

// Formatted returns sink laying every envelope out in f (sink.format)
// before it is published; the caller's batch is left as it is.
func Formatted(sink core.Sink, f core.WireFormat) core.Sink {
	if f.Format == "" || f.Format == core.FormatPosthorn {
		return sink
	}
	return Wrap(sink, func(ctx context.Context, batch []core.Envelope, publish PublishFunc) error {
		out := make([]core.Envelope, len(batch))
		for i, e := range batch {
			out[i] = f.Apply(e)
		}
		return publish(ctx, out)
	})
}
