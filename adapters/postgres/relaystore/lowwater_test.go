package relaystore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres/pgtest"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
)

// sameShard returns n account IDs of shard's shard, prefix-0 … in order.
func sameShard(prefix string, shard, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if a := fmt.Sprintf("%s-%d", prefix, i); core.ShardOf(a) == shard {
			out = append(out, a)
		}
	}
	return out
}

// drain reads and marks every unrelayed row of every shard under leases,
// the way the relay does, until a read comes back empty, and returns the
// ids it read.
func drain(t *testing.T, store *relaystore.Store, leases []core.Lease) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	for range 1000 {
		rows, err := store.ReadBatch(ctx, allShards(), 20, core.OrderByID)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			return ids
		}
		refs := make([]core.RowRef, len(rows))
		for i, r := range rows {
			refs[i], ids = core.RowRef{ID: r.ID, Shard: r.Shard}, append(ids, r.ID)
		}
		if _, refused, err := store.MarkRelayed(ctx, refs, leases); err != nil || refused != 0 {
			t.Fatalf("marker: %d refused, %v", refused, err)
		}
	}
	t.Fatal("the outbox never drained")
	return nil
}

// raised drains until the mark of shard reaches at least want.
func raised(t *testing.T, store *relaystore.Store, leases []core.Lease, shard int, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for store.Marks([]int{shard})[0] < want {
		if time.Now().After(deadline) {
			t.Fatalf("the mark of shard %d stayed at %d, below %d, for 30 s of reads", shard, store.Marks([]int{shard})[0], want)
		}
		drain(t, store, leases)
		time.Sleep(20 * time.Millisecond) // the relay's shortest poll
	}
}

func takeAllShards(t *testing.T, store *relaystore.Store, owner string) []core.Lease {
	t.Helper()
	leases, err := store.AcquireLeases(context.Background(), owner, core.Shards, nil, time.Minute)
	if err != nil || len(leases) != core.Shards {
		t.Fatalf("leases %v, %v", leases, err)
	}
	return leases
}

// A shard's low-water mark rises as the relay drains it, but never past a
// row whose transaction took its id and has not committed yet: while any
// transaction that may hold an id below it runs, the mark stays put, and
// the row is read once it commits. The late transaction's first statement
// is the outbox insert itself, so it takes its transaction ID from the
// column's default, before its id. Control: a store that raises the marks
// after every read steps over the late row for good, as a cursor would.
func TestLowWaterMarkNeverPassesALateCommit(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, pool := pgtest.Ledger(t)
			store := relaystore.New(pool)
			if control {
				store = relaystore.NewTrustingEveryRead(pool)
			}
			leases := takeAllShards(t, store, "r")
			const shard = 3
			accounts := sameShard("acc", shard, 40)
			commitRows(t, pool, accounts[:20]...)
			drain(t, store, leases)
			// A later read completes the drain's ticks once every transaction
			// of the server that was running then has ended (other tests'
			// included).
			raised(t, store, leases, shard, 1)

			late, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer late.Rollback(ctx) //nolint:errcheck
			var lateID int64
			if err := late.QueryRow(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
VALUES (gen_random_uuid(), 'event', 't', 't', 'account', 'acc-late', 1, $1, '{}', now()) RETURNING id`, shard).Scan(&lateID); err != nil {
				t.Fatal(err)
			}
			for _, a := range accounts[20:] {
				commitRows(t, pool, a)
				drain(t, store, leases)
			}
			mark := store.Marks([]int{shard})[0]
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			got := drain(t, store, leases)
			t.Logf("control %v: mark of shard %d %d while the late row %d was uncommitted; read after its commit: %v",
				control, shard, mark, lateID, slices.Contains(got, lateID))
			switch {
			case !control && (mark > lateID || !slices.Contains(got, lateID)):
				t.Fatalf("the mark rose to %d past the uncommitted row %d, or the row was not read after its commit (%v)", mark, lateID, got)
			case control && slices.Contains(got, lateID):
				t.Fatal("control: the store that trusts every read still read the late row; the test proves nothing")
			}
		})
	}
}

// The rows of a parked aggregate are not read, so a mark may pass them;
// releasing the aggregate (deleting its park, which moves
// relay_release_seq) makes the next reads start at the shards' first
// entries again, and the released rows are read. Control: a store that
// keeps its marks through a release never reads them.
func TestLowWaterMarkRereadsAReleasedAggregate(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, pool := pgtest.Ledger(t)
			store := relaystore.New(pool)
			if control {
				store = relaystore.NewIgnoringReleases(pool)
			}
			leases := takeAllShards(t, store, "r")
			const shard = 5
			accounts := sameShard("acc", shard, 30)
			parked := commitRows(t, pool, accounts[0])[0]
			if _, err := store.Park(ctx, core.ParkedAggregate{AggregateType: core.AggregateAccount, AggregateID: accounts[0],
				EventID: "00000000-0000-0000-0000-000000000001", Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			for _, a := range accounts[1:] {
				commitRows(t, pool, a)
				drain(t, store, leases)
			}
			raised(t, store, leases, shard, parked.ID+1)
			if err := store.Release(ctx, core.AggregateAccount, accounts[0]); err != nil {
				t.Fatal(err)
			}
			var got []int64
			for range 3 { // the first read after the release still runs from the old marks
				got = append(got, drain(t, store, leases)...)
			}
			t.Logf("control %v: released row %d read: %v", control, parked.ID, slices.Contains(got, parked.ID))
			if slices.Contains(got, parked.ID) == control {
				t.Fatalf("control %v: the released row read %v", control, slices.Contains(got, parked.ID))
			}
		})
	}
}
