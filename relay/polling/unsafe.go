package polling

import (
	"context"

	"github.com/posthorn/posthorn/core"
)

// unsafeMarkThenPublish is Hooks.UnsafeMarkBeforeAck: the marker first,
// then the send. It exists only so the fault suite can show that this
// order loses events when the relay dies, or the sink fails, between the
// two; the relay never uses it otherwise.
func (r *Relay) unsafeMarkThenPublish(ctx context.Context, rows []core.OutboxRow, batch []core.Envelope) error {
	refs := make([]core.RowRef, len(rows))
	for i, row := range rows {
		refs[i] = row.RowRef
	}
	if _, _, err := r.store.MarkRelayed(ctx, refs, r.leases); err != nil {
		r.log.Error("UNSAFE mark-before-ACK: write relay markers", "rows", len(refs), "err", err)
		return nil
	}
	pubCtx, cancel := context.WithDeadline(ctx, r.deadline)
	defer cancel()
	if err := r.sink.Publish(pubCtx, batch); err != nil {
		r.log.Error("UNSAFE mark-before-ACK: publish failed after the marker; these records are lost", "rows", len(batch), "err", err)
		return nil
	}
	r.m.PublishedTotal.Add(float64(len(batch)))
	return nil
}

// afterCursor keeps the rows above *cursor and moves it to the largest id
// read: the unsafe "position > last" reading of Hooks.UnsafeCursor.
func afterCursor(rows []core.OutboxRow, cursor *int64) []core.OutboxRow {
	var kept []core.OutboxRow
	last := *cursor
	for _, row := range rows {
		if row.ID > *cursor {
			kept = append(kept, row)
		}
		last = max(last, row.ID)
	}
	*cursor = last
	return kept
}
