package sinktest

import (
	"testing"

	"github.com/posthorn/posthorn/core"
)

// testRepeatsReachTheConsumer publishes a batch, then at once replays it
// (the same event IDs with the replay header) and resends it (the same
// event IDs, header resend: true), as `posthorn replay` and `posthorn
// outbox resend` do. A broker with its own dedup (JetStream's Nats-Msg-Id
// inside its duplicate window) must not swallow them: the reader has to
// find every event ID three times, the repeats marked, so that the
// consumer's inbox sees them and counts them as duplicates.
func testRepeatsReachTheConsumer(t *testing.T, h Harness) {
	var first []core.Envelope
	for rev := int64(1); rev <= 5; rev++ {
		first = append(first, Envelope(core.TopicEvents, "acc-repeat-a", rev), Envelope(core.TopicEvents, "acc-repeat-b", rev))
	}
	if err := publish(t, h, first); err != nil {
		t.Fatalf("first publish: %v", err)
	}
	replay := make([]core.Envelope, len(first))
	resend := make([]core.Envelope, len(first))
	for i, e := range first {
		replay[i] = e
		replay[i].Replay = true
		resend[i] = e
		resend[i].Headers = map[string]string{core.HeaderResend: "true"}
	}
	if err := publish(t, h, replay); err != nil {
		t.Fatalf("replay right after the first publish: %v", err)
	}
	if err := publish(t, h, resend); err != nil {
		t.Fatalf("resend right after the first publish: %v", err)
	}
	want := 3 * len(first)
	recs := read(t, h, core.TopicEvents, want)
	type seen struct{ plain, replay, resend int }
	got := map[string]*seen{}
	for _, r := range recs {
		id := r.Headers[core.HeaderEventID]
		if got[id] == nil {
			got[id] = &seen{}
		}
		switch {
		case r.Headers[core.HeaderReplay] == "true":
			got[id].replay++
		case r.Headers[core.HeaderResend] == "true":
			got[id].resend++
		default:
			got[id].plain++
		}
	}
	for _, e := range first {
		s := got[e.EventID]
		if s == nil || s.plain != 1 || s.replay != 1 || s.resend != 1 {
			t.Fatalf("event %s reached the reader as %+v, want once each as first publish, replay and resend: the broker swallowed a repeat", e.EventID, s)
		}
	}
}
