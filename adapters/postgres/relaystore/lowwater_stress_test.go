package relaystore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// Twelve writers commit for 8 s, each transaction holding its rows open
// for a random while after taking their ids (some took a transaction ID
// earlier still, some roll back), while one reader reads and marks as the
// polling relay does: the next batch is read while the last one's marker
// is in flight, skipping its rows. Every committed row is read, and every
// shard's mark has risen. With a transaction ID held open in another
// database of the server (another service's transaction, which keeps the
// oldest running one from moving) the marks rise only through the
// question about the outbox's writers. Control: the store that trusts
// every read steps over rows that commit late.
func TestLowWaterMarkLosesNothingUnderManyLateCommits(t *testing.T) {
	eachLossCase(t, 1, lateCommits)
}

var errRollBack = errors.New("roll back")

// lateCommits runs the writers and the reader of
// TestLowWaterMarkLosesNothingUnderManyLateCommits, with a transaction ID
// held open in another database if holdXID, and returns the ids of the
// committed rows never read.
func lateCommits(t *testing.T, control, holdXID bool) []int64 {
	t.Helper()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	if holdXID {
		_, other := pgtest.Consumer(t)
		holdXIDOpen(t, other)
	}
	store := relaystore.New(pool).AuditingEveryRead(true)
	if control {
		store = relaystore.NewTrustingEveryRead(pool).AuditingEveryRead(false)
	}
	leases := takeAllShards(t, store, "r")
	var (
		mu        sync.Mutex
		committed []int64
		seen      = map[int64]bool{}
	)
	writing, reading := make(chan struct{}), make(chan struct{})
	var writers sync.WaitGroup
	for w := range 12 {
		writers.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 42))
			for {
				select {
				case <-writing:
					return
				default:
				}
				var ids []int64
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if rnd.IntN(2) == 0 {
						if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
							return err
						}
					}
					for range 1 + rnd.IntN(3) {
						ids = append(ids, insertRelayRow(t, tx, fmt.Sprintf("acc-%d-%d", w, rnd.IntN(30))).ID)
					}
					time.Sleep(time.Duration(rnd.IntN(30)) * time.Millisecond)
					if rnd.IntN(10) == 0 {
						return errRollBack
					}
					return nil
				})
				switch {
				case errors.Is(err, errRollBack):
				case err != nil:
					t.Error(err)
					return
				default:
					mu.Lock()
					committed = append(committed, ids...)
					mu.Unlock()
				}
			}
		})
	}
	var reader sync.WaitGroup
	reader.Go(func() {
		var inflight []core.RowRef
		marker := make(chan error, 1)
		marker <- nil
		for {
			select {
			case <-reading:
				<-marker
				return
			default:
			}
			skip := make([]int64, len(inflight))
			for i, r := range inflight {
				skip[i] = r.ID
			}
			rows, err := store.ReadBatchSkipping(ctx, allShards(), 20, skip, core.OrderByID)
			if err == nil {
				err = <-marker
			}
			if err != nil {
				t.Error(err)
				return
			}
			inflight = make([]core.RowRef, len(rows))
			mu.Lock()
			for i, r := range rows {
				seen[r.ID], inflight[i] = true, r.RowRef
			}
			mu.Unlock()
			go func(refs []core.RowRef) {
				_, _, err := store.MarkRelayed(ctx, refs, leases)
				marker <- err
			}(inflight)
			if len(rows) == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
	time.Sleep(8 * time.Second)
	close(writing)
	writers.Wait()
	// The reader drains what is left; a row a mark stepped over stays
	// unread for good.
	wait.Until(15*time.Second, func() (bool, string) { return relaytest.Unrelayed(t, pool) == 0, "" })
	close(reading)
	reader.Wait()
	var missing []int64
	for _, id := range committed {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	marks := store.Marks(allShards())
	t.Logf("%d rows committed; marks at the end %v", len(committed), marks)
	// Reads from every shard's start would lose nothing either.
	if !control && slices.Contains(marks, 0) {
		t.Fatalf("a shard's mark never rose: %v", marks)
	}
	return missing
}
