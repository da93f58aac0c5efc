package inboxstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// A batch gives each event the disposition it would get received alone in
// (aggregate, revision) order: applied in order, a repeat of an event ID
// (recorded before, or earlier in the same batch), a revision already
// applied under another event ID (a conflict, which parks its aggregate), a
// gap held, an event of a parked aggregate kept behind the park.
func TestReceiveBatchDispositionsAsOneByOne(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	ctx := context.Background()
	mustReceive(t, in, "c", true, inboxEvent("acc-a", 1), apply, core.DispositionApplied)
	mustReceive(t, in, "c", true, inboxEvent("acc-c", 1), apply, core.DispositionApplied)
	if _, err := in.ParkPoison(ctx, "c", true, inboxEvent("acc-p", 1), "bad payload"); err != nil {
		t.Fatal(err)
	}
	otherID := inboxEvent("acc-c", 1)
	otherID.EventID = "acc-c-r1-under-another-id"
	batch := []core.Envelope{
		inboxEvent("acc-a", 3), // delivered before r2: applied after it
		inboxEvent("acc-b", 1),
		inboxEvent("acc-a", 2),
		inboxEvent("acc-a", 2), // the same event twice in one batch
		inboxEvent("acc-c", 1), // recorded before the batch
		otherID,                // revision 1 is already applied as acc-c-r1
		inboxEvent("acc-a", 5), // 4 is missing
		inboxEvent("acc-p", 2), // behind the poison park
	}
	res, err := in.ReceiveBatch(ctx, "c", true, batch, apply, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []core.Disposition{core.DispositionApplied, core.DispositionApplied, core.DispositionApplied,
		core.DispositionDuplicate, core.DispositionDuplicate, core.DispositionRevisionConflict,
		core.DispositionHeld, core.DispositionParkedGap}
	for i, o := range res.Outcomes {
		if o.Disposition != want[i] || o.EventID != batch[i].EventID {
			t.Errorf("outcome %d (%s): %+v, want %s", i, batch[i].EventID, o, want[i])
		}
	}
	if !res.Outcomes[3].Repeat || !res.Outcomes[4].Repeat || res.Outcomes[5].Repeat || !res.Outcomes[6].GapDetected {
		t.Errorf("repeat and gap flags: %+v", res.Outcomes)
	}
	if res.Outcomes[5].ConflictsWith != "acc-c-r1" {
		t.Errorf("conflict %+v, want it to name acc-c-r1", res.Outcomes[5])
	}
	if got, want := read(), []string{"acc-a-r1", "acc-c-r1", "acc-a-r2", "acc-a-r3", "acc-b-r1"}; !slices.Equal(got, want) {
		t.Errorf("effects %v, want %v (each once, an account's revisions in order)", got, want)
	}
	if !slices.Equal(res.Held, []core.AggregateKey{{Type: core.AggregateAccount, ID: "acc-a"}}) {
		t.Errorf("held aggregates %v, want acc-a", res.Held)
	}
	for acc, want := range map[string]int64{"acc-a": 3, "acc-b": 1, "acc-c": 1, "acc-p": 0} {
		if got, err := in.LastRevision(ctx, "c", core.AggregateAccount, acc); err != nil || got != want {
			t.Errorf("%s last revision %d (%v), want %d", acc, got, err, want)
		}
	}
	recs, err := in.Dispositions(ctx, "c", []string{"acc-a-r2", "acc-c-r1"})
	if err != nil {
		t.Fatal(err)
	}
	if recs["acc-a-r2"].Duplicates != 1 || recs["acc-c-r1"].Duplicates != 1 {
		t.Errorf("repeats not counted on their rows: %+v", recs)
	}
	// The held revision is re-driven once its predecessor is applied.
	mustReceive(t, in, "c", true, inboxEvent("acc-a", 4), apply, core.DispositionApplied)
	if outs, err := in.Drain(ctx, "c", true, core.AggregateAccount, "acc-a", apply); err != nil || len(outs) != 1 {
		t.Fatalf("drain: %v %+v", err, outs)
	}
	if got, _ := in.LastRevision(ctx, "c", core.AggregateAccount, "acc-a"); got != 5 {
		t.Errorf("acc-a at %d after the drain, want 5", got)
	}
}

// A batch is all or nothing: a failing apply (per event or set-based)
// rolls back every row and effect of the batch and names the event.
func TestReceiveBatchApplyErrorRecordsNothing(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	ctx := context.Background()
	boom := errors.New("boom")
	failing := func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		if err := apply(ctx, tx, e); err != nil {
			return err
		}
		if e.EventID == "acc-b-r1" {
			return boom
		}
		return nil
	}
	batch := []core.Envelope{inboxEvent("acc-a", 1), inboxEvent("acc-b", 1), inboxEvent("acc-c", 1)}
	_, err := in.ReceiveBatch(ctx, "c", true, batch, failing, nil)
	var ae *consumers.ApplyError
	if !errors.As(err, &ae) || ae.Envelope.EventID != "acc-b-r1" || !errors.Is(err, boom) {
		t.Fatalf("err %v, want the ApplyError of acc-b-r1", err)
	}
	allFail := func(context.Context, pgx.Tx, []core.Envelope) error { return boom }
	if _, err := in.ReceiveBatch(ctx, "u", false, batch, apply, allFail); !errors.As(err, &ae) || !errors.Is(err, boom) {
		t.Fatalf("set-based apply: err %v, want an ApplyError", err)
	}
	if got := read(); len(got) != 0 {
		t.Errorf("effects %v after failed batches", got)
	}
	for _, c := range []string{"c", "u"} {
		n, err := in.Count(ctx, c)
		if err != nil || len(n.Events) != 0 {
			t.Errorf("consumer %s inbox %+v (%v) after a failed batch", c, n, err)
		}
	}
	if got, _ := in.LastRevision(ctx, "c", core.AggregateAccount, "acc-a"); got != 0 {
		t.Errorf("position advanced to %d by a failed batch", got)
	}
}

// Two instances applying overlapping batches at once, their events in
// opposite orders, still apply each event exactly once and each account in
// revision order, and do not deadlock (the positions are locked sorted).
func TestReceiveBatchConcurrentInstancesOneEffect(t *testing.T) {
	t.Parallel()
	in, apply, read := newInbox(t)
	ctx := context.Background()
	const accounts, revs = 20, 5
	var all []core.Envelope
	for r := int64(1); r <= revs; r++ {
		for a := range accounts {
			all = append(all, inboxEvent(fmt.Sprintf("acc-%02d", a), r))
		}
	}
	var instances errgroup.Group
	for inst := range 2 {
		instances.Go(func() error {
			es := slices.Clone(all)
			if inst == 1 {
				slices.Reverse(es)
			}
			for r := 0; r < len(es); r += accounts {
				// Ordered by revision per account within the instance's
				// stream: reversed batches reach higher revisions first
				// and hold them.
				res, err := in.ReceiveBatch(ctx, "c", true, es[r:r+accounts], apply, nil)
				if err != nil {
					return err
				}
				for _, ref := range res.Held {
					if _, err := in.Drain(ctx, "c", true, ref.Type, ref.ID, apply); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	if err := instances.Wait(); err != nil {
		t.Fatal(err)
	}
	// What either instance left held is re-driven by the sweeper's pass.
	refs, err := in.Runnable(ctx, "c", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range refs {
		if _, err := in.Drain(ctx, "c", true, ref.Type, ref.ID, apply); err != nil {
			t.Fatal(err)
		}
	}
	got := read()
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	if len(got) != len(all) || len(seen) != len(all) {
		t.Fatalf("%d effects of %d distinct events, want %d each once", len(got), len(seen), len(all))
	}
	last := map[string]int64{}
	for _, id := range got {
		var acc string
		var rev int64
		if _, err := fmt.Sscanf(id, "acc-%2s-r%d", &acc, &rev); err != nil {
			t.Fatal(err)
		}
		if rev != last[acc]+1 {
			t.Fatalf("acc-%s: revision %d applied after %d", acc, rev, last[acc])
		}
		last[acc] = rev
	}
}
