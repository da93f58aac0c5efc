package relaytest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// StallingFencedSink is a transactional sink (relay.FencedSink) over a
// memory sink whose fences, while Stalled, wait until their context ends:
// a transaction coordinator out of reach. Its transactions are the memory
// sink's publishes.
type StallingFencedSink struct {
	*memory.Sink
	Stalled atomic.Bool
	fences  atomic.Int64
}

var _ relay.FencedSink = (*StallingFencedSink)(nil)

// Fence waits for ctx while the sink is stalled; otherwise it fences at
// once, with no committed rows to report.
func (s *StallingFencedSink) Fence(ctx context.Context, shard int) ([]int64, error) {
	s.fences.Add(1)
	if s.Stalled.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, nil
}

// PublishShard publishes batch to the memory sink.
func (s *StallingFencedSink) PublishShard(ctx context.Context, shard int, batch []core.Envelope, ids []int64) error {
	return s.Publish(ctx, batch)
}

// Unfence does nothing.
func (s *StallingFencedSink) Unfence(int) {}

// Fences counts the fences asked for.
func (s *StallingFencedSink) Fences() int64 { return s.fences.Load() }

// KeepsLeaseWhileStalled fails t if lapsed reports a lease lapsed within d
// of stalled fences, or if fewer than two rounds of fences were asked for
// (the stall was not exercised); then it lets the fences answer.
func (s *StallingFencedSink) KeepsLeaseWhileStalled(t testing.TB, d time.Duration, lapsed func() bool) {
	t.Helper()
	if wait.Until(d, func() (bool, string) { return lapsed(), "" }) {
		t.Fatalf("a lease lapsed while the fences stalled (%d fences so far)", s.Fences())
	}
	if n := s.Fences(); n < 2*core.Shards {
		t.Fatalf("%d fences in %v: the stall was not exercised", n, d)
	}
	s.Stalled.Store(false)
}
