package relaystore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
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
	return drainBatches(t, store, leases, 20)
}

// raised drains until the mark of shard reaches at least want.
func raised(t *testing.T, store *relaystore.Store, leases []core.Lease, shard int, want int64) {
	t.Helper()
	wait.ForStatus(t, 30*time.Second, fmt.Sprintf("the mark of shard %d to reach %d", shard, want), func() (bool, string) {
		drain(t, store, leases)
		m := store.Marks([]int{shard})[0]
		return m >= want, fmt.Sprintf("mark %d", m)
	})
}

// eachStore runs body twice in parallel, each time on a ledger of its own
// with every shard leased: with the production store (control false) and
// with the store unsafe makes of the pool (control true). The production
// store audits its marks after every read: no test here may find a row
// below them (relay.ErrRowsBelowMarks).
func eachStore(t *testing.T, unsafe func(*pgxpool.Pool) *relaystore.Store,
	body func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease)) {
	eachCase(t, func(control bool, pool *pgxpool.Pool) *relaystore.Store {
		if control {
			return unsafe(pool).AuditingEveryRead(false)
		}
		return relaystore.New(pool).AuditingEveryRead(true)
	}, body)
}

// eachCase is eachStore with the store of each case made by store.
func eachCase(t *testing.T, store func(control bool, pool *pgxpool.Pool) *relaystore.Store,
	body func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease)) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
			t.Parallel()
			_, pool := pgtest.Ledger(t)
			s := store(control, pool)
			body(t, control, pool, s, takeAllShards(t, s, "r"))
		})
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

// commitParked commits a row of account's and parks the account.
func commitParked(t *testing.T, pool *pgxpool.Pool, store *relaystore.Store, account string) core.RowRef {
	t.Helper()
	row := commitRows(t, pool, account)[0]
	if _, err := store.Park(context.Background(), core.ParkedAggregate{AggregateType: core.AggregateAccount, AggregateID: account,
		EventID: "00000000-0000-0000-0000-000000000001", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	return row
}

// holdXIDOpen opens a transaction on pool that holds a transaction ID
// until the test ends.
func holdXIDOpen(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := beginOpen(t, pool).Exec(context.Background(), `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
}

// beginOpen begins a transaction on pool that is rolled back when the test
// ends unless committed.
func beginOpen(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return tx
}

// eachLossCase runs lose, which returns the committed rows' ids that were
// never read, with the production store (without and with a transaction
// ID held open) and with the control's store, which must lose a row
// within attempts runs (the loss may need a commit to fall between two
// statements).
func eachLossCase(t *testing.T, attempts int, lose func(t *testing.T, control, holdXID bool) []int64) {
	t.Parallel()
	for _, c := range []struct {
		control, holdXID bool
	}{{false, false}, {false, true}, {true, false}} {
		t.Run(fmt.Sprintf("control=%v/hold_xid=%v", c.control, c.holdXID), func(t *testing.T) {
			t.Parallel()
			var missing []int64
			for run := range attempts {
				missing = lose(t, c.control, c.holdXID)
				t.Logf("control %v, run %d: %d committed rows never read", c.control, run+1, len(missing))
				if !c.control || len(missing) > 0 {
					break
				}
			}
			if (len(missing) > 0) != c.control {
				t.Fatalf("control %v: rows never read: %v", c.control, missing)
			}
		})
	}
}

// A shard's low-water mark rises as the relay drains it, but never past a
// row whose transaction took its id and has not committed yet: while any
// transaction that may hold an id below it runs, the mark stays put, and
// the row is read once it commits. The late transaction's first statement
// is the outbox insert itself, so it takes its transaction ID from the
// column's default, before its id. Control: a store that raises the marks
// after every read steps over the late row for good, as a cursor would.
func TestLowWaterMarkNeverPassesALateCommit(t *testing.T) {
	eachStore(t, relaystore.NewTrustingEveryRead, func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease) {
		ctx := context.Background()
		const shard = 3
		accounts := sameShard("acc", shard, 40)
		commitRows(t, pool, accounts[:20]...)
		drain(t, store, leases)
		// A later read completes the drain's ticks once every transaction
		// of the server that was running then has ended (other tests'
		// included).
		raised(t, store, leases, shard, 1)

		late, lateID := beginLate(t, pool, shard)
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

// An audit finds a committed row below the marks, however it came to be
// there: it drops the marks, the next read says so (relay.ErrRowsBelowMarks),
// and the row is read. Here the marks pass a late commit because the store
// trusts every read. Control: the same store without the audit never reads
// the row.
func TestAuditFindsARowBelowTheMarks(t *testing.T) {
	eachCase(t, func(control bool, pool *pgxpool.Pool) *relaystore.Store {
		return relaystore.NewTrustingEveryRead(pool).AuditingEveryRead(!control)
	}, func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease) {
		ctx := context.Background()
		audited := !control
		const shard = 3
		accounts := sameShard("acc", shard, 30)
		commitRows(t, pool, accounts[:10]...)
		drain(t, store, leases)
		late, lateID := beginLate(t, pool, shard)
		for _, a := range accounts[10:] {
			commitRows(t, pool, a)
			drain(t, store, leases)
		}
		if mark := store.Marks([]int{shard})[0]; mark <= lateID {
			t.Fatalf("the marks did not pass the late row %d (mark %d): the test proves nothing", lateID, mark)
		}
		if err := late.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		var reported error
		read := wait.Until(5*time.Second, func() (bool, string) {
			rows, err := store.ReadBatch(ctx, allShards(), 20, core.OrderByID)
			if err != nil {
				if !errors.Is(err, relay.ErrRowsBelowMarks) {
					t.Fatal(err)
				}
				reported = err
				return false, ""
			}
			refs := make([]core.RowRef, len(rows))
			for i, r := range rows {
				refs[i] = r.RowRef
			}
			if _, _, err := store.MarkRelayed(ctx, refs, leases); err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(rows, func(r core.OutboxRow) bool { return r.ID == lateID }), ""
		})
		t.Logf("audited %v: the late row %d read after its commit: %v; reported: %v", audited, lateID, read, reported)
		if audited != read || audited != (reported != nil) {
			t.Fatalf("audited %v: the late row read %v, reported %v", audited, read, reported)
		}
	})
}

// The rows of a parked aggregate are not read, so a mark may pass them;
// releasing the aggregate (deleting its park, which moves
// the generation in relay_release) makes the next reads start at the shards' first
// entries again, and the released aggregate's rows are read whole and in
// order. Control: a store that keeps its marks through a release reads
// the aggregate's later row without the one below its mark.
func TestLowWaterMarkRereadsAReleasedAggregate(t *testing.T) {
	eachStore(t, relaystore.NewIgnoringReleases, func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease) {
		ctx := context.Background()
		const shard = 5
		accounts := sameShard("acc", shard, 30)
		parked := commitParked(t, pool, store, accounts[0])
		for _, a := range accounts[1:] {
			commitRows(t, pool, a)
			drain(t, store, leases)
		}
		raised(t, store, leases, shard, parked.ID+1)
		later := commitRows(t, pool, accounts[0])[0]
		if err := store.Release(ctx, core.AggregateAccount, accounts[0]); err != nil {
			t.Fatal(err)
		}
		// The first read after the release: the aggregate's rows whole
		// and in order, the one below the mark first.
		rows, err := store.ReadBatch(ctx, allShards(), 20, core.OrderByID)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, r := range rows {
			if r.Envelope.AggregateID == accounts[0] {
				got = append(got, r.ID)
			}
		}
		whole := slices.Equal(got, []int64{parked.ID, later.ID})
		t.Logf("control %v: the released aggregate's rows %d and %d, the first read after the release returned %v",
			control, parked.ID, later.ID, got)
		if whole == control {
			t.Fatalf("control %v: the first read after the release returned %v of the released aggregate, want [%d %d]", control, got, parked.ID, later.ID)
		}
	})
}

// A release moves the generation in the deleting transaction, so no read
// sees the new generation while it still sees the park: reads made while
// the release is open (its transaction holds an ID, so the marks rise
// through the question about the outbox's writers) skip the parked rows
// under the old generation, and the first read after the commit drops the
// marks and returns the released aggregate's rows. Control: the
// generation moved outside the deleting transaction and seen first, as a
// sequence's nextval is: those reads raise the marks past the parked rows
// under the new generation, and after the commit nothing moves again.
func TestLowWaterMarkSeesAReleaseOnlyWithItsCommit(t *testing.T) {
	// The audit would find the control's row below the marks.
	eachCase(t, func(control bool, pool *pgxpool.Pool) *relaystore.Store {
		return relaystore.New(pool).AuditingEveryRead(!control)
	}, func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease) {
		ctx := context.Background()
		const shard = 6
		accounts := sameShard("acc", shard, 30)
		parked := commitParked(t, pool, store, accounts[0])
		drain(t, store, leases)
		release := beginOpen(t, pool)
		if control {
			// The delete without the trigger; the generation moved
			// at once, outside the release's transaction.
			if _, err := release.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE relay_release SET generation = generation + 1`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := release.Exec(ctx, `DELETE FROM relay_parked WHERE aggregate_id = $1`, accounts[0]); err != nil {
			t.Fatal(err)
		}
		for _, a := range accounts[1:] {
			commitRows(t, pool, a)
			drain(t, store, leases)
		}
		raised(t, store, leases, shard, parked.ID+1)
		if err := release.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		got := drain(t, store, leases)
		read := slices.Contains(got, parked.ID)
		t.Logf("control %v: the released row %d read after the release's commit: %v", control, parked.ID, read)
		if read == control {
			t.Fatalf("control %v: the released row %d read after the commit: %v (%v)", control, parked.ID, read, got)
		}
	})
}

// While a long snapshot keeps VACUUM from removing the markers' deleted
// queue entries (a report, pg_dump, a standby's feedback: a REPEATABLE
// READ transaction that holds no transaction ID), the read's cost stays
// that of the rows it returns: the marks still rise, since the snapshot
// holds no transaction that could take an id. The same holds for the
// count of the backlog behind the relay's gauges (Status). 20,000 events
// are drained (each read and marked as the relay does) under the snapshot,
// and the read and the count that follow are measured in buffers. Control:
// the store that scans each shard's queue from its start touches every
// deleted entry again, in the read and in the count.
func TestReadCostUnderALongSnapshot(t *testing.T) {
	t.Parallel()
	cost := map[bool][2]int64{} // the read's, the count's
	for _, control := range []bool{false, true} {
		ctx := context.Background()
		_, pool := pgtest.Ledger(t)
		store := relaystore.New(pool)
		if control {
			store = relaystore.NewWalkingFromStart(pool)
		}
		leases := takeAllShards(t, store, "r")
		snapshot, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := snapshot.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
			t.Fatal(err)
		}
		if _, err := snapshot.Exec(ctx, `SELECT count(*) FROM outbox`); err != nil { // takes the snapshot
			t.Fatal(err)
		}
		const events = 20000
		var read int
		for i := 0; i < events; i += 1000 {
			if _, err := pool.Exec(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
SELECT gen_random_uuid(), 'event', 't', 't', 'account', 'acc-' || (g % 64), g, ('x' || substr(md5('acc-' || (g % 64)), 1, 8))::bit(32)::int & 15, '{}', now()
FROM generate_series($1::int, $2::int) g`, i+1, i+1000); err != nil {
				t.Fatal(err)
			}
			read += len(drainBatches(t, store, leases, 500))
		}
		if read != events {
			t.Fatalf("control %v: drained %d of %d events", control, read, events)
		}
		if !control {
			// The last reads' and counts' ticks complete once every
			// transaction of the server running then has ended (other
			// tests' too).
			last := pgtest.Column[int64](t, pool, `SELECT max(id) FROM outbox`)[0]
			for shard := range core.Shards {
				raised(t, store, leases, shard, last+1)
				counted(t, store, shard, last+1)
			}
		}
		if st, err := store.Status(ctx); err != nil || st.Backlog != 0 {
			t.Fatalf("control %v: backlog %d after the drain, %v", control, st.Backlog, err)
		}
		readCost, err := store.ReadBuffers(ctx, allShards(), 500)
		if err != nil {
			t.Fatal(err)
		}
		countCost, err := store.StatusBuffers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = snapshot.Rollback(ctx)
		cost[control] = [2]int64{readCost, countCost}
	}
	t.Logf("one read and one count of the backlog after 20,000 events were marked under a long snapshot: %v buffers with the marks, %v scanning each shard from its start",
		cost[false], cost[true])
	for i, what := range []string{"read", "count of the backlog"} {
		if cost[false][i] > 100 || cost[true][i] < 10*cost[false][i] {
			t.Fatalf("%s: %d buffers with the marks, %d without: want a small one, and the control at least 10 times as costly", what, cost[false][i], cost[true][i])
		}
	}
}

// counted waits until the marks Status counts shard's backlog from reach
// want, counting as the relay's gauges do.
func counted(t *testing.T, store *relaystore.Store, shard int, want int64) {
	t.Helper()
	wait.ForStatus(t, 30*time.Second, fmt.Sprintf("the count mark of shard %d to reach %d", shard, want), func() (bool, string) {
		if _, err := store.Status(context.Background()); err != nil {
			t.Fatal(err)
		}
		m := store.CountMarks([]int{shard})[0]
		return m >= want, fmt.Sprintf("mark %d", m)
	})
}

// beginLate begins a transaction that inserts an outbox row of shard as
// its first statement (taking its transaction ID from the column's
// default, then its id) and leaves it open; it is rolled back when the
// test ends unless committed.
func beginLate(t *testing.T, pool *pgxpool.Pool, shard int) (pgx.Tx, int64) {
	t.Helper()
	late := beginOpen(t, pool)
	var id int64
	if err := late.QueryRow(context.Background(), `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
VALUES (gen_random_uuid(), 'event', 't', 't', 'account', 'acc-late', 1, $1, '{}', now()) RETURNING id`, shard).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return late, id
}

// drainBatches is drain with reads of up to perShard rows of each shard.
func drainBatches(t *testing.T, store *relaystore.Store, leases []core.Lease, perShard int) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	for range 1000 {
		rows, err := store.ReadBatch(ctx, allShards(), perShard, core.OrderByID)
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

// A transaction that holds a transaction ID but writes no outbox row (an
// application's open transaction, a long update elsewhere) cannot commit a
// row below a mark: the marks still rise past the ids taken after it
// began, since no transaction that writes the outbox is that old. Control:
// waiting for the oldest running transaction to end, the marks stop for as
// long as it stays open.
func TestLowWaterMarkRisesPastAnOpenTransactionThatWritesNoOutbox(t *testing.T) {
	eachStore(t, relaystore.NewWaitingForEveryTransaction, func(t *testing.T, control bool, pool *pgxpool.Pool, store *relaystore.Store, leases []core.Lease) {
		ctx := context.Background()
		open, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer open.Rollback(ctx) //nolint:errcheck
		if _, err := open.Exec(ctx, `INSERT INTO accounts (id) VALUES ('acc-elsewhere')`); err != nil {
			t.Fatal(err)
		}
		const shard = 7
		ids := commitRows(t, pool, sameShard("acc", shard, 10)...)
		last := ids[len(ids)-1].ID
		wait.Until(5*time.Second, func() (bool, string) {
			drain(t, store, leases)
			return store.Marks([]int{shard})[0] > last, ""
		})
		mark := store.Marks([]int{shard})[0]
		t.Logf("control %v: mark of shard %d after 5 s of reads with an unrelated transaction open: %d (last id %d)", control, shard, mark, last)
		if (mark > last) == control {
			t.Fatalf("control %v: the mark is %d, the last id %d", control, mark, last)
		}
	})
}

// Two relays share one store (as relays in one process do), each reading
// and marking its own half of the shards in a loop, while 200 rows commit
// one transaction at a time: every row is read. A tick's next transaction
// ID must bound every transaction that had taken an outbox id when its last
// id was read. Run twice: as it is, and with an unrelated transaction
// holding a transaction ID open, so that ticks complete only through the
// question about the outbox's writers, which must complete no tick another
// read made after it was asked (lowwater_internal_test.go shows that
// order of events and its control). Control: a snapshot's xmax, which is
// the latest completed transaction plus one, not the next to be assigned;
// a transaction still running can hold a greater ID, and rows are stepped
// over (up to three runs, since the loss needs a commit to fall between
// two statements).
func TestLowWaterMarkLosesNothingUnderConcurrentCommits(t *testing.T) {
	eachLossCase(t, 3, concurrentCommits)
}

// concurrentCommits runs two readers over halves of the shards of one
// store while 200 rows commit (with a transaction ID held open by another
// session if holdXID), and returns the ids never read.
func concurrentCommits(t *testing.T, control, holdXID bool) []int64 {
	t.Helper()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	store := relaystore.New(pool).AuditingEveryRead(true)
	if control {
		store = relaystore.NewUsingSnapshotXmax(pool).AuditingEveryRead(false)
	}
	if holdXID {
		holdXIDOpen(t, pool)
	}
	var seen sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, owner := range []string{"a", "b"} {
		leases, err := store.AcquireLeases(ctx, owner, core.Shards/2, nil, time.Minute)
		if err != nil || len(leases) != core.Shards/2 {
			t.Fatalf("leases %v, %v", leases, err)
		}
		var shards []int
		for _, l := range leases {
			shards = append(shards, l.Shard)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				rows, err := store.ReadBatchSkipping(ctx, shards, 10, nil, core.OrderByID)
				if err != nil {
					t.Error(err)
					return
				}
				refs := make([]core.RowRef, len(rows))
				for i, r := range rows {
					seen.Store(r.ID, true)
					refs[i] = core.RowRef{ID: r.ID, Shard: r.Shard}
				}
				if _, _, err := store.MarkRelayed(ctx, refs, leases); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var posted []int64
	for i := range 200 {
		posted = append(posted, commitRows(t, pool, fmt.Sprintf("acc-%d", i%40))[0].ID)
	}
	// Both readers drain what is left; a row a mark stepped over stays
	// unread for good.
	wait.Until(10*time.Second, func() (bool, string) { return relaytest.Unrelayed(t, pool) == 0, "" })
	close(stop)
	wg.Wait()
	var missing []int64
	for _, id := range posted {
		if _, ok := seen.Load(id); !ok {
			missing = append(missing, id)
		}
	}
	return missing
}
