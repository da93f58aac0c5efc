package polling

import (
	"context"
	"time"

	"github.com/posthorn/posthorn/core"
)

// readAhead is the read of the next batch, run while the current one is
// published. It skips the current batch's rows and those of the marker in
// flight, so nothing is read twice. Its rows are published only after the
// current batch was ACKed in full, under the same leases; otherwise they
// are dropped and read again. Per aggregate, the rows it finds follow the
// current batch's (a later revision becomes visible only after the earlier
// ones), so order is unchanged.
type readAhead struct {
	done chan struct{}
	rows []core.OutboxRow
	err  error
}

func (r *Relay) readAhead(ctx context.Context, shards []int, perShard int, skip []int64, order core.ReadOrder) *readAhead {
	a := &readAhead{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.rows, a.err = r.store.ReadBatchSkipping(ctx, shards, perShard, skip, order)
	}()
	return a
}

// wait returns the read's result once it is done (nothing for nil).
func (a *readAhead) wait() ([]core.OutboxRow, error) {
	if a == nil {
		return nil, nil
	}
	<-a.done
	return a.rows, a.err
}

// markJob is the marker of a fully ACKed batch, written in the background
// while the loop reads and publishes the next batch. The next read skips
// the job's rows, so nothing is read twice, and since that batch is only
// published after this one's ACK, per-aggregate order is unchanged. If the
// marker fails, its rows stay unrelayed and are sent again (same IDs).
type markJob struct {
	refs   []core.RowRef
	leases []core.Lease
	done   chan struct{}
	marked int
	refuse int
	err    error
}

func (j *markJob) rowIDs() []int64 {
	ids := make([]int64, len(j.rowRefs()))
	for i, r := range j.rowRefs() {
		ids[i] = r.ID
	}
	return ids
}

func (j *markJob) rowRefs() []core.RowRef {
	if j == nil {
		return nil
	}
	return j.refs
}

func (r *Relay) startMark(ctx context.Context, j *markJob) *markJob {
	j.done = make(chan struct{})
	go func() {
		defer close(j.done)
		j.marked, j.refuse, j.err = r.store.MarkRelayed(ctx, j.refs, j.leases)
	}()
	return j
}

// awaitMark waits for j's marker and accounts for its outcome.
func (r *Relay) awaitMark(j *markJob) {
	if j == nil {
		return
	}
	<-j.done
	switch {
	case j.err != nil:
		// The records are out; without a marker they will be sent again with
		// the same event IDs. That is the safe side.
		r.log.Error("write relay markers", "rows", len(j.refs), "err", j.err)
		if r.fences != nil {
			// Without the markers, these committed rows would be read and
			// sent again: fence their shards, which marks them first.
			for _, ref := range j.refs {
				r.fences.Need(ref.Shard)
			}
		}
	case j.refuse > 0:
		r.m.FencedMarkers.Add(float64(j.refuse))
		r.log.Warn("markers refused: a lease was taken over; its new owner resends", "refused", j.refuse, "marked", j.marked)
		r.nextMaintain = time.Time{}
	}
}
