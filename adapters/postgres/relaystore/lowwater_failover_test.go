package relaystore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// A promoted standby gives out again the outbox ids (and transaction IDs)
// that the old primary gave out after the standby lost touch with it. A
// store that reads through a multi-host URL keeps running across the
// failover, so marks raised on the old primary's ids would step over the
// new primary's rows. The store drops its marks when it reads another
// history, and reads every row the new primary commits. Control: a store
// that keeps its marks across the failover never reads them.
func TestLowWaterMarkStartsOverOnAPromotedStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("a throwaway primary and standby")
	}
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
			t.Parallel()
			read, committed := readAcrossAFailover(t, control)
			missed := 0
			for _, id := range committed {
				if !slices.Contains(read, id) {
					missed++
				}
			}
			t.Logf("control %v: the new primary committed %d rows (ids %v), the store read %d of them",
				control, len(committed), committed, len(committed)-missed)
			switch {
			case !control && missed > 0:
				t.Fatalf("%d of the promoted standby's %d rows were never read: the marks of the old primary stepped over them", missed, len(committed))
			case control && missed == 0:
				t.Fatal("control: the store that keeps its marks across the failover read every row; the test proves nothing")
			}
		})
	}
}

// readAcrossAFailover drains 5 rows the standby receives and 100 it does
// not, until the marks stand past them, fails the ledger over, commits 10
// rows on the promoted standby and drains again through the same store; it
// returns the ids of the last drain and of those 10 rows.
func readAcrossAFailover(t *testing.T, keepMarks bool) (read, committed []int64) {
	f := relaytest.NewFailover(t, pgcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/ledger?sslmode=disable&target_session_attrs=read-write",
		f.Primary.User(), f.Primary.Port(), f.Standby.Port())
	pool, err := postgres.Connect(ctx, url, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store := relaystore.New(pool)
	if keepMarks {
		store = relaystore.NewIgnoringHistory(pool)
	}
	leases := takeAllShards(t, store, "r")
	commitRows(t, f.Pool, sameShard("streamed", 3, 5)...)
	drain(t, store, leases)
	wait.For(t, 30*time.Second, "the standby to replay the first rows", func() bool {
		var caught bool
		err := f.Pool.QueryRow(ctx, `SELECT coalesce(bool_and(replay_lsn >= pg_current_wal_lsn()), false) FROM pg_stat_replication`).Scan(&caught)
		if err != nil {
			t.Fatal(err)
		}
		return caught
	})
	if err := f.Standby.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	var last int64
	for i := range 100 {
		refs := commitRows(t, f.Pool, fmt.Sprintf("lost-%d", i))
		last = refs[0].ID
	}
	for _, s := range allShards() {
		raised(t, store, leases, s, last+1)
	}

	f.KillPrimaryAndPromote(t)
	pool.Reset()
	promoted, err := postgres.Connect(ctx, f.Standby.URL("ledger"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(promoted.Close)
	for i := range 10 {
		refs := commitRows(t, promoted, fmt.Sprintf("after-%d", i))
		committed = append(committed, refs[0].ID)
	}
	if committed[0] > last {
		t.Fatalf("the promoted standby gave out id %d, past the old primary's last %d: the failover does not reuse ids, the test proves nothing", committed[0], last)
	}
	leases = takeAllShards(t, store, "r")
	return drain(t, store, leases), committed
}
