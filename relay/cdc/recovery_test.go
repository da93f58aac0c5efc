package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay/cdc"
)

// dropSlot ends the slot's WAL sender and drops the slot, retrying while the
// relay reconnects in between.
func (f *fixture) dropSlot() {
	f.t.Helper()
	ctx := context.Background()
	wait.For(f.t, 10*time.Second, "the slot to be dropped", func() bool {
		_, _ = f.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, f.slot)
		_, err := f.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, f.slot)
		return err == nil
	})
}

// Drop the slot mid-stream under load: the relay says so (error log,
// posthorn_cdc_slot_recoveries_total{reason="missing"}), creates a new slot,
// sends what the stream lost from the outbox, and streams again; nothing
// is lost and no account's order breaks. With the catch-up switched off
// (negative control) the same fault loses events.
func TestSlotDroppedMidStreamRecoversThroughOutbox(t *testing.T) {
	t.Parallel()
	for _, catchUp := range []bool{true, false} {
		t.Run(fmt.Sprintf("catchup=%v", catchUp), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, nil)
			var creations atomic.Int32
			var gap []relaytest.Posted
			r := f.start("relay-a", nil, &cdc.Hooks{SkipCatchUp: !catchUp, BeforeSlotCreate: func() {
				if creations.Add(1) == 2 {
					// Commits while no slot exists: only the outbox has them.
					for i := range 10 {
						gap = append(gap, relaytest.MustPost(t, f.pool, fmt.Sprintf("acc-%d", i))...)
					}
				}
			}})
			f.waitStreaming()
			w := startWriters(t, f.pool, 3, 20, time.Millisecond)
			wait.For(t, 30*time.Second, "300 events", func() bool { return w.count() >= 300 })
			f.dropSlot()
			wait.For(t, 30*time.Second, "the relay to stream again", func() bool {
				return strings.Count(f.logs.String(), "streaming the outbox from the slot") >= 2
			})
			wait.For(t, 30*time.Second, "600 more events", func() bool { return w.count() >= 900 })
			posted := append(w.finish(t), gap...)
			if n := promtest.Value(t, r.reg, "posthorn_cdc_slot_recoveries_total", "reason", "missing"); n != 1 {
				t.Errorf("posthorn_cdc_slot_recoveries_total{reason=missing} = %v, want 1", n)
			}
			if !strings.Contains(f.logs.String(), "CDC SLOT LOST") || !strings.Contains(f.logs.String(), "level=ERROR") {
				t.Errorf("no error log about the lost slot:\n%s", f.logs)
			}
			if !catchUp {
				lost := f.lostOnce(posted[len(posted)-len(gap)-1], "the newest streamed event", posted)
				if len(lost) == 0 {
					t.Fatal("negative control: without the outbox catch-up, dropping the slot lost nothing")
				}
				t.Logf("without catch-up: %d of %d events lost", len(lost), len(posted))
				return
			}
			got := f.waitAllDelivered(posted, 60*time.Second)
			relaytest.CheckOrder(t, got, true)
			t.Logf("%d events, %d records (%d repeated), catch-up sent %v, skipped as marked %v", len(posted), len(got), repeats(got),
				promtest.Value(t, r.reg, "posthorn_cdc_catchup_events_total"), promtest.Value(t, r.reg, "posthorn_cdc_skipped_marked_total"))
		})
	}
}

// generateWAL writes and throws away a table of about mb megabytes in
// database url's pool, switches the WAL segment and checkpoints, so the
// server may remove old segments (and invalidate slots holding them).
func generateWAL(t *testing.T, f *fixture, mb int) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS wal_filler (id int, pad text)`,
		fmt.Sprintf(`INSERT INTO wal_filler SELECT g, repeat('x', 1000) FROM generate_series(1, %d) g`, mb*900),
		`TRUNCATE wal_filler`,
		`SELECT pg_switch_wal()`,
		`CHECKPOINT`,
	} {
		if _, err := f.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

func (f *fixture) walStatus() string {
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT coalesce((SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1), 'missing')`, f.slot).Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

// Let the server invalidate the slot (max_slot_wal_keep_size) while the
// relay is stopped and events are committed: the next start says the slot
// is lost (error log, recoveries{reason="lost"}), sends those events from
// the outbox and streams from a new slot; nothing is lost. Negative control:
// without the catch-up those events are lost.
func TestSlotInvalidatedWhileStoppedRecoversThroughOutbox(t *testing.T) {
	t.Parallel()
	c := pgtest.LogicalCluster(t, pgcluster.Options{MaxSlotWALKeepSize: "32MB"})
	for _, catchUp := range []bool{true, false} {
		t.Run(fmt.Sprintf("catchup=%v", catchUp), func(t *testing.T) {
			f := newFixture(t, c)
			ctx := context.Background()
			a := f.start("relay-a", nil)
			f.waitStreaming()
			posted := relaytest.MustPostTransfers(t, f.pool, 50, 9, 4)
			f.waitAllDelivered(posted, 30*time.Second)
			if err := a.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			whileStopped := relaytest.MustPostN(t, f.pool, 40, 9)
			posted = append(posted, whileStopped...)
			for i := 0; f.walStatus() != "lost"; i++ {
				if i == 6 {
					t.Fatalf("slot not invalidated after %d rounds of WAL; wal_status %s", i, f.walStatus())
				}
				generateWAL(t, f, 24)
			}
			b := f.start("relay-b", nil, &cdc.Hooks{SkipCatchUp: !catchUp})
			f.waitStreaming(2)
			after := relaytest.MustPostN(t, f.pool, 20, 9)
			posted = append(posted, after...)
			if n := promtest.Value(t, b.reg, "posthorn_cdc_slot_recoveries_total", "reason", "lost"); n != 1 {
				t.Errorf("posthorn_cdc_slot_recoveries_total{reason=lost} = %v, want 1", n)
			}
			if !strings.Contains(f.logs.String(), "wal_status=lost") {
				t.Errorf("no error log about the invalidated slot:\n%s", f.logs)
			}
			if !catchUp {
				wait.For(t, 30*time.Second, "the events after the restart", func() bool { return len(f.missing(after)) == 0 })
				lost := f.missing(posted)
				if len(lost) != len(whileStopped) {
					t.Fatalf("negative control: without catch-up %d events lost, want the %d committed while the relay was stopped", len(lost), len(whileStopped))
				}
				return
			}
			got := f.waitAllDelivered(posted, 30*time.Second)
			relaytest.CheckOrder(t, got, true)
			if promtest.Value(t, b.reg, "posthorn_wal_slot_status", "status", "reserved") != 1 {
				t.Errorf("the new slot's wal_status gauge is not reserved")
			}
		})
	}
}
