package opsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

func retentionEnvelope(agg string, rev int64) core.Envelope {
	return core.Envelope{EventID: uuid.Must(uuid.NewV7()).String(), Kind: core.KindEvent,
		Type: core.TypeAccountPosted, Topic: core.TopicEvents, AggregateType: core.AggregateAccount, AggregateID: agg, Revision: rev,
		OccurredAt: time.Now()}
}

func noop(context.Context, pgx.Tx, core.Envelope) error { return nil }

func inboxRows(t *testing.T, pool *pgxpool.Pool, consumer string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, disposition FROM consumer_inbox WHERE consumer = $1`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id, d string
		if err := rows.Scan(&id, &d); err != nil {
			t.Fatal(err)
		}
		out[id] = d
	}
	return out
}

// Inbox retention: an ordered consumer's final rows go
// once below the applied revision and past the margin, the last applied
// one and every held, parked or rejected row stay; an unordered consumer's
// go only past the replay window plus the margin. A repeat of a pruned
// ordered event is still recognised (by revision); Pruned names exactly
// the pruned events.
func TestPruneInboxKeepsWhatARepeatNeeds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	in := inboxstore.New(pool)
	const ord, unord = "ordered-c", "unordered-c"
	var evs []core.Envelope
	for rev := int64(1); rev <= 5; rev++ {
		e := retentionEnvelope("acc-a", rev)
		evs = append(evs, e)
		if _, err := in.Receive(ctx, ord, true, e, noop); err != nil {
			t.Fatal(err)
		}
		if _, err := in.Receive(ctx, unord, false, e, noop); err != nil {
			t.Fatal(err)
		}
	}
	// acc-b: revision 2 arrives before 1 and is held; acc-c is parked.
	heldEv := retentionEnvelope("acc-b", 2)
	if out, err := in.Receive(ctx, ord, true, heldEv, noop); err != nil || out.Disposition != core.DispositionHeld {
		t.Fatalf("held: %+v %v", out, err)
	}
	poison := retentionEnvelope("acc-c", 1)
	if _, err := in.ParkPoison(ctx, ord, true, poison, "bad"); err != nil {
		t.Fatal(err)
	}
	rejected := retentionEnvelope("acc-d", 1)
	if _, err := in.Reject(ctx, unord, rejected.EventID, rejected, nil, nil, "no"); err != nil {
		t.Fatal(err)
	}
	// Everything was last touched two days ago.
	if _, err := pool.Exec(ctx, `UPDATE consumer_inbox SET updated_at = now() - interval '48 hours'`); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	// Margin 1 h; the replay window keeps the unordered rows (3 days).
	h := ops.InboxHorizon{Ordered: now.Add(-time.Hour), Unordered: now.Add(-72 * time.Hour)}
	res, err := in.PruneInbox(ctx, ord, h, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 4 || res.Batches < 3 {
		t.Fatalf("ordered: %+v, want revisions 1..4 deleted in batches of 2", res)
	}
	left := inboxRows(t, pool, ord)
	if len(left) != 3 || left[evs[4].EventID] != "applied" || left[heldEv.EventID] != "held" || left[poison.EventID] != "parked_poison" {
		t.Fatalf("ordered rows left: %v; want the last applied, the held and the parked one", left)
	}
	if res, err := in.PruneInbox(ctx, unord, h, 2); err != nil || res.Deleted != 0 {
		t.Fatalf("unordered inside the replay window: %+v %v, want nothing deleted", res, err)
	}
	// A repeat of a pruned ordered event is recognised: no second effect.
	applied := 0
	count := func(context.Context, pgx.Tx, core.Envelope) error { applied++; return nil }
	if out, err := in.Receive(ctx, ord, true, evs[1], count); err != nil || out.Disposition != core.DispositionDuplicate || applied != 0 {
		t.Fatalf("repeat of pruned revision 2: %+v %v, applied %d; want a duplicate", out, err, applied)
	}
	// Pruned: the ordered consumer's revisions 1, 3 and 4 (2 has a row again).
	var cands []ops.PrunedCandidate
	for _, e := range evs {
		cands = append(cands, ops.PrunedCandidate{EventID: e.EventID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
			Revision: e.Revision, CreatedAt: now.Add(-49 * time.Hour)})
	}
	got, err := in.Pruned(ctx, ord, cands)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range evs {
		if want := i < 4; got[e.EventID] != want {
			t.Errorf("Pruned(revision %d) = %v, want %v", e.Revision, got[e.EventID], want)
		}
	}
	if got, err := in.Pruned(ctx, "never-pruned", cands); err != nil || len(got) != 0 {
		t.Fatalf("Pruned for a consumer without retention: %v %v", got, err)
	}

	// Past the replay window plus the margin, the unordered rows go too,
	// except the rejected one.
	h.Unordered = now.Add(-time.Hour)
	if res, err := in.PruneInbox(ctx, unord, h, 1000); err != nil || res.Deleted != 5 {
		t.Fatalf("unordered past the horizon: %+v %v, want 5 deleted", res, err)
	}
	if left := inboxRows(t, pool, unord); len(left) != 1 || left[rejected.EventID] != "rejected" {
		t.Fatalf("unordered rows left: %v", left)
	}
}

// Idempotency keys expire after the TTL: an expired key
// is deleted and its repeat is a new posting; a fresh key still replays.
func TestPruneIdempotencyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	store := ledgerstore.New(pool, ledgerstore.Config{})
	p := core.Posting{Entries: []core.Entry{
		{Account: "acc-a", Direction: core.Debit, Amount: 5, Currency: "EUR"},
		{Account: "acc-b", Direction: core.Credit, Amount: 5, Currency: "EUR"},
	}}
	for i := range 5 {
		if _, _, err := store.Post(ctx, fmt.Sprintf("old-%d", i), p); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := store.Post(ctx, "fresh", p); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = now() - interval '40 days' WHERE key LIKE 'old-%'`); err != nil {
		t.Fatal(err)
	}
	res, err := opsstore.New(pool).PruneIdempotencyKeys(ctx, time.Now().Add(-30*24*time.Hour), 2)
	if err != nil || res.Deleted != 5 || res.Batches != 3 {
		t.Fatalf("prune: %+v %v, want 5 keys in 3 batches", res, err)
	}
	if _, replayed, err := store.Post(ctx, "old-0", p); err != nil || replayed {
		t.Fatalf("repeat of an expired key: replayed %v, %v; want a new posting", replayed, err)
	}
	if _, replayed, err := store.Post(ctx, "fresh", p); err != nil || !replayed {
		t.Fatalf("repeat of a fresh key: replayed %v, %v; want the stored response", replayed, err)
	}
}
