package cdcsource_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay/cdc"
)

// A row streamed from the slot decodes to exactly what the polling read
// path reads for it (every envelope field, headers and the replay flag
// included); a dropped slot is reported as gone.
func TestStreamedRowMatchesReadBatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, pool := pgtest.LogicalLedger(t, pgcluster.Options{}, 4)
	src := cdcsource.New(pool)
	if err := src.CheckServer(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := src.CreateSlot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, journal_id, headers, payload, occurred_at)
VALUES ('0190a000-0000-7000-8000-000000000001', 'command', 'payouts.payout.execute', 'commands.payouts', 'account', 'acc-x', 3, $1,
        '0190a000-0000-7000-8000-00000000beef', '{"replay":"true","trace":"a b"}', '\x00ff7b7d', '2026-11-29 10:11:12.123456+01')`,
		core.ShardOf("acc-x"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := relaystore.New(pool).ReadBatch(ctx, []int{core.ShardOf("acc-x")}, 10, core.OrderByID)
	if err != nil || len(want) != 1 {
		t.Fatalf("read batch: %v %v", want, err)
	}
	st, err := cdcsource.OpenStream(ctx, pool, "s1", "posthorn_outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close(context.Background())
	var got *core.OutboxRow
	var commit cdc.LSN
	for commit == 0 {
		ev, err := st.Next(ctx, time.Now().Add(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Kind {
		case cdc.EventNone:
			t.Fatal("no row streamed within 10s")
		case cdc.EventRow:
			got = &ev.Row
		case cdc.EventCommit:
			commit = ev.LSN
		}
	}
	if got == nil {
		t.Fatal("commit without the row")
	}
	w, g := want[0], *got
	if !w.Envelope.OccurredAt.Equal(g.Envelope.OccurredAt) {
		t.Errorf("occurred_at: streamed %v, read %v", g.Envelope.OccurredAt, w.Envelope.OccurredAt)
	}
	w.Envelope.OccurredAt, g.Envelope.OccurredAt = time.Time{}, time.Time{}
	if w.ID != g.ID || w.Shard != g.Shard || !reflect.DeepEqual(w.Envelope, g.Envelope) {
		t.Fatalf("streamed row\n%+v\nread row\n%+v", g, w)
	}
	if !g.Envelope.Replay || g.Envelope.Kind != core.KindCommand {
		t.Errorf("replay flag or kind lost: %+v", g.Envelope)
	}
	if err := st.Confirm(ctx, commit); err != nil {
		t.Fatal(err)
	}

	// Dropping the slot under the stream: starting it again says it is gone.
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's1'`); err != nil {
		t.Fatal(err)
	}
	// The WAL sender exits asynchronously: its slot can be dropped then.
	wait.ForStatus(t, 10*time.Second, "slot s1 dropped", func() (bool, string) {
		err := src.DropSlot(ctx, "s1")
		return err == nil, fmt.Sprint(err)
	})
	if _, err := cdcsource.OpenStream(ctx, pool, "s1", "posthorn_outbox"); !cdcsource.IsSlotGone(err) {
		t.Fatalf("stream of a dropped slot: %v, want IsSlotGone", err)
	}
	if ss, err := src.SlotStatus(ctx, "s1"); err != nil || ss.Exists {
		t.Fatalf("status of a dropped slot: %+v %v", ss, err)
	}
}

// The CDC marker reports rows it cannot see yet (a transaction decoded from
// the WAL may not be visible to other sessions for a moment) instead of
// counting them as done, and marks them once they are visible; a lease
// taken over fences it.
func TestMarkRelayedCDCReportsInvisibleRows(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	st := cdcsource.New(pool)
	l, ok, err := st.AcquireLease(ctx, "s", "relay-a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	visible := relaytest.MustPost(t, pool, "acc-1")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := relaytest.Post(ctx, tx, "acc-2"); err != nil {
		t.Fatal(err)
	}
	var openID int64
	if err := tx.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&openID); err != nil {
		t.Fatal(err)
	}
	var visibleID int64
	if err := pool.QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, visible[0].EventID).Scan(&visibleID); err != nil {
		t.Fatal(err)
	}
	both := []core.RowRef{{ID: visibleID, Shard: core.ShardOf("acc-1")}, {ID: openID, Shard: core.ShardOf("acc-2")}}
	marked, invisible, fenced, err := st.MarkRelayed(ctx, both, l)
	if err != nil || fenced || marked != 1 || len(invisible) != 1 || invisible[0].ID != openID {
		t.Fatalf("mark with one row invisible: marked %d invisible %v fenced %v err %v; want 1, [%d]", marked, invisible, fenced, err, openID)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	marked, invisible, _, err = st.MarkRelayed(ctx, both, l)
	if err != nil || marked != 1 || len(invisible) != 0 {
		t.Fatalf("after commit: marked %d invisible %v err %v; want 1 marked (the other already was), none invisible", marked, invisible, err)
	}
	// A takeover fences the old grant.
	if _, err := pool.Exec(ctx, `UPDATE relay_cdc_leases SET expires_at = now() - interval '1s'`); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.AcquireLease(ctx, "s", "relay-b", time.Minute); err != nil || !ok {
		t.Fatalf("takeover: %v %v", ok, err)
	}
	more := relaytest.MustPost(t, pool, "acc-3")
	var moreID int64
	if err := pool.QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, more[0].EventID).Scan(&moreID); err != nil {
		t.Fatal(err)
	}
	if marked, _, fenced, err := st.MarkRelayed(ctx, []core.RowRef{{ID: moreID, Shard: core.ShardOf("acc-3")}}, l); err != nil || !fenced || marked != 0 {
		t.Fatalf("stale grant: marked %d fenced %v err %v; want fenced", marked, fenced, err)
	}
}
