package cdc_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay/cdc"
)

// A reader that stalls (here: inside a batch, longer than the lease) loses
// the slot to the standby, which ends the stalled reader's WAL sender and
// streams; the stalled reader, when it wakes, abandons its batch instead of
// publishing it late. Nothing is lost and no account's order breaks.
func TestStalledReaderIsReplacedByStandby(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	release := make(chan struct{})
	var stalled atomic.Bool
	a := f.start("relay-a", nil, &cdc.Hooks{BeforePublish: func([]core.Envelope) error {
		if stalled.CompareAndSwap(false, true) {
			<-release
		}
		return nil
	}})
	f.waitStreaming()
	b := f.start("relay-b", nil)
	w := startWriters(t, f.pool, 2, 10, 2*time.Millisecond)
	wait.For(t, 30*time.Second, "b to take over the slot", func() bool {
		return promtest.Value(t, b.reg, "posthorn_cdc_reader") == 1
	})
	close(release)
	wait.For(t, 30*time.Second, "a to abandon its batch", func() bool {
		return promtest.Value(t, a.reg, "posthorn_relay_abandoned_batches_total") == 1
	})
	f.standbyTookOver(w, 400, b)
	if !strings.Contains(f.logs.String(), "ending its WAL sender") && !strings.Contains(f.logs.String(), "abandoning batch") {
		t.Errorf("logs say nothing of the takeover:\n%s", f.logs)
	}
}

// A record the sink rejects for good parks its account only: later rows of
// that account are held (not sent out of order), every other account keeps
// flowing, and after the operator fixes the cause and releases the
// account, its held rows are sent in revision order.
func TestParkedAccountIsHeldAndSentInOrderAfterRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.sink = memory.New(memory.Config{MaxPayloadBytes: 1000})
	t.Cleanup(func() { _ = f.sink.Close() })
	ctx := context.Background()
	r := f.start("relay-a", nil)
	f.waitStreaming()
	posted := relaytest.MustPost(t, f.pool, "acc-bad", "acc-ok")
	bad := relaytest.MustPostPayload(t, f.pool, "acc-bad", make([]byte, 2000))
	posted = append(posted, bad)
	held := relaytest.MustPost(t, f.pool, "acc-bad")
	posted = append(posted, held...)
	others := relaytest.MustPostN(t, f.pool, 20, 4)
	flowing := append(posted[:2:2], others...)
	wait.For(t, 30*time.Second, "the other accounts' events", func() bool { return len(f.missing(flowing)) == 0 })
	wait.For(t, 10*time.Second, "acc-bad parked", func() bool {
		p, _ := f.store.Parked(ctx)
		return len(p) == 1 && p[0].AggregateID == "acc-bad"
	})
	if m := f.missing([]relaytest.Posted{bad, held[0]}); len(m) != 2 {
		t.Fatalf("a record of the parked account was delivered after its rejected one")
	}
	// The operator fixes the cause (here: the payload) and releases.
	if _, err := f.pool.Exec(ctx, `UPDATE outbox SET payload = '\x7b7d' WHERE event_id = $1`, bad.EventID); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Release(ctx, core.AggregateAccount, "acc-bad"); err != nil {
		t.Fatal(err)
	}
	got := f.waitAllDelivered(append(posted, others...), 30*time.Second)
	relaytest.CheckOrder(t, got, false)
	if n := promtest.Value(t, r.reg, "posthorn_relay_parked_aggregates"); n > 1 {
		t.Errorf("parked gauge %v", n)
	}
}

// A soft stop under load hands the slot over at once (the lease is
// released, no takeover by expiry): the stopping reader delivers, marks and
// confirms what it received, the standby resumes from the confirmed
// position, and nothing is lost or sent twice (streamed rows its catch-up
// already sent are skipped as marked).
func TestSoftStopHandsOverWithoutLossOrRepeat(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	a := f.start("relay-a", nil)
	f.waitStreaming()
	b := f.start("relay-b", nil)
	w := startWriters(t, f.pool, 3, 20, time.Millisecond)
	wait.For(t, 30*time.Second, "300 events", func() bool { return w.count() >= 300 })
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "b to read the slot", func() bool { return promtest.Value(t, b.reg, "posthorn_cdc_reader") == 1 })
	wait.For(t, 30*time.Second, "600 more events", func() bool { return w.count() >= 900 })
	posted := w.finish(t)
	got := f.waitAllDelivered(posted, 60*time.Second)
	relaytest.CheckOrder(t, got, false)
	if len(got) != len(posted) {
		t.Fatalf("%d records for %d events: %d repeated across a soft stop", len(got), len(posted), repeats(got))
	}
	if n := promtest.Value(t, b.reg, "posthorn_relay_lease_takeovers_total"); n != 0 {
		t.Errorf("b counted %v takeovers; a released the lease", n)
	}
}
