package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/posthorn/posthorn/core"
)

// This file notices a failover under the relay: the server it streams from
// now writes on another timeline (a promoted standby), and what the relay
// published on the old one past the point where the new history branched
// off is not in the ledger.

// publishedKept is how many of the events it published last a relay
// remembers, to name them after a failover; the failover check finds
// every one from the sink and the consumers.
const publishedKept = 10_000

// publishedLog is what the relay published on one timeline: the highest
// commit position, and the last publishedKept events with theirs. Owned by
// the relay's goroutine.
type publishedLog struct {
	timeline int32
	upTo     LSN
	events   []publishedEvent // a ring of publishedKept
	next     int
}

type publishedEvent struct {
	id string
	// commit is the end of its transaction's commit record.
	commit LSN
}

// add records streamed rows published, each with the end of its
// transaction's commit record (ends, by row ID): the transaction is in a
// history that branched off at or after that position. (Rows of the
// catch-up read committed before the stream began; they are not kept.)
func (p *publishedLog) add(rows []core.OutboxRow, ends map[int64]LSN) {
	for _, row := range rows {
		end := ends[row.ID]
		p.upTo = max(p.upTo, end)
		e := publishedEvent{id: row.Envelope.EventID, commit: end}
		if len(p.events) < publishedKept {
			p.events = append(p.events, e)
			continue
		}
		p.events[p.next] = e
		p.next = (p.next + 1) % publishedKept
	}
}

// after returns the events kept whose commit record ends past lsn.
func (p *publishedLog) after(lsn LSN) []publishedEvent {
	var out []publishedEvent
	for _, e := range p.events {
		if e.commit > lsn {
			out = append(out, e)
		}
	}
	return out
}

// standbyQuick is how long a wait for the standbys may take before the
// relay makes sure the server is still on the timeline its rows came from.
const standbyQuick = 100 * time.Millisecond

// sameTimeline returns errHistoryChanged when the server no longer writes
// on the timeline of this session's stream.
func (r *Relay) sameTimeline(ctx context.Context) error {
	tl, err := r.store.Timeline(ctx)
	if err != nil {
		return err
	}
	if tl != r.published.timeline {
		return fmt.Errorf("%w (timeline %d, now %d)", errHistoryChanged, r.published.timeline, tl)
	}
	return nil
}

// checkBranch runs at the start of every session: when the server's
// timeline is no longer the one the relay published on, it compares the
// highest commit it published with the new history's branch point and
// names, at ERROR, every event it remembers publishing past it. Those
// events are on the wire and not in the ledger; the relay's history gate
// (Settings.History) holds publishing until posthorn failover recover.
func (r *Relay) checkBranch(ctx context.Context) error {
	tl, err := r.store.Timeline(ctx)
	if err != nil {
		return err
	}
	prev := r.published.timeline
	if prev == 0 || prev == tl {
		r.published.timeline = tl
		return nil
	}
	defer func() { r.published = publishedLog{timeline: tl} }()
	bp, err := r.store.BranchPoint(ctx, prev)
	if err != nil {
		r.log.Error("CDC RELAY CANNOT PLACE WHAT IT PUBLISHED: the ledger's timeline changed and the old one is not in its history; run posthorn failover check",
			"old_timeline", prev, "timeline", tl, "published_up_to", r.published.upTo.String(), "err", err)
		return nil
	}
	if r.published.upTo <= bp {
		r.log.Warn("the ledger's timeline changed (a failover); nothing this relay published is past the new history's branch point",
			"old_timeline", prev, "timeline", tl, "branch_point", bp.String(), "published_up_to", r.published.upTo.String())
		return nil
	}
	past := r.published.after(bp)
	ids := make([]string, len(past))
	for i, e := range past {
		ids[i] = e.id
	}
	r.m.pastBranch.Add(float64(len(past)))
	r.log.Error("CDC RELAY PUBLISHED PAST THE NEW HISTORY'S BRANCH POINT: these events are on the wire and not in the ledger; run posthorn failover check, then posthorn failover recover",
		"old_timeline", prev, "timeline", tl, "branch_point", bp.String(), "published_up_to", r.published.upTo.String(),
		"events", len(past), "event_ids", ids)
	return nil
}
