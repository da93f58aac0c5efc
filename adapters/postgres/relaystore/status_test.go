package relaystore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
)

// The backlog's count starts at marks of its own, which never pass a row
// whose transaction took its id and has not committed yet: once it
// commits, the count has it. Control: counting from marks raised after
// every count, the late row lies below them and the backlog reads 0
// while the row waits to be relayed.
func TestBacklogCountHasALateCommit(t *testing.T) {
	eachStore(t, relaystore.NewTrustingEveryRead, func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease) {
		ctx := context.Background()
		const shard = 3
		accounts := sameShard("acc", shard, 30)
		commitRows(t, pool, accounts[:10]...)
		drain(t, store, leases)
		counted(t, store, shard, 1)

		late, lateID := beginLate(t, pool, shard)
		for _, a := range accounts[10:] {
			commitRows(t, pool, a)
			drain(t, store, leases)
			if _, err := store.Status(ctx); err != nil {
				t.Fatal(err)
			}
		}
		mark := store.CountMarks([]int{shard})[0]
		if err := late.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := store.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("control %v: count mark of shard %d %d while the late row %d was uncommitted; backlog after its commit %d",
			control, shard, mark, lateID, st.Backlog)
		switch {
		case !control && (mark > lateID || st.Backlog != 1):
			t.Fatalf("count mark %d, late row %d, backlog %d after its commit: want the mark at or below the row and a backlog of 1", mark, lateID, st.Backlog)
		case control && st.Backlog != 0:
			t.Fatalf("control: backlog %d; the count from marks raised after every count still had the late row, the test proves nothing", st.Backlog)
		}
	})
}

// The read's marks pass a parked aggregate's rows (it skips them); the
// count's never do, so the backlog keeps them while the marks rise past
// them. Control: counting from the read's marks, the parked row is below
// them and the backlog reads 0.
func TestBacklogCountKeepsParkedRowsBelowTheReadMarks(t *testing.T) {
	eachStore(t, relaystore.NewCountingFromReadMarks, func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease) {
		ctx := context.Background()
		const shard = 5
		accounts := sameShard("acc", shard, 20)
		parked := commitParked(t, pool, store, accounts[0])
		for _, a := range accounts[1:] {
			commitRows(t, pool, a)
			drain(t, store, leases)
		}
		last := commitRows(t, pool, accounts[1])[0]
		raised(t, store, leases, shard, last.ID+1)
		counted(t, store, shard, parked.ID)
		st, err := store.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		read, count := store.Marks([]int{shard})[0], store.CountMarks([]int{shard})[0]
		t.Logf("control %v: parked row %d, read mark %d, count mark %d, backlog %d", control, parked.ID, read, count, st.Backlog)
		switch {
		case !control && (count > parked.ID || st.Backlog != 1):
			t.Fatalf("count mark %d over the parked row %d, or backlog %d: want the parked row counted, 1", count, parked.ID, st.Backlog)
		case control && st.Backlog != 0:
			t.Fatalf("control: backlog %d counting from the read's mark %d; the test proves nothing", st.Backlog, read)
		}
	})
}
