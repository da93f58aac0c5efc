package cdc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay/cdc"
)

// An idle outbox while another database of the cluster writes (an "idle
// hour" compressed: a short heartbeat, several rounds of foreign WAL and
// checkpoints) does not grow the WAL the slot retains. Negative control:
// with the heartbeat (and keepalive confirmation) off, it grows by about
// everything written.
func TestIdleSlotDoesNotRetainWAL(t *testing.T) {
	t.Parallel()
	c := pgtest.LogicalCluster(t, pgcluster.Options{})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE DATABASE other`); err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(ctx, c.URL("other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, `CREATE TABLE filler (id int, pad text)`); err != nil {
		t.Fatal(err)
	}
	const rounds, mbPerRound = 6, 8
	for _, heartbeat := range []bool{true, false} {
		t.Run(fmt.Sprintf("heartbeat=%v", heartbeat), func(t *testing.T) {
			f := newFixture(t, c)
			r := f.start("relay-a", nil, &cdc.Hooks{UnsafeNoHeartbeat: !heartbeat})
			f.waitStreaming()
			// Some traffic first, so the slot has a position of its own.
			posted := relaytest.MustPost(t, f.pool, "acc-1", "acc-2")
			f.waitAllDelivered(posted, 10*time.Second)
			var start int64
			if err := f.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&start); err != nil {
				t.Fatal(err)
			}
			for range rounds {
				for _, q := range []string{
					fmt.Sprintf(`INSERT INTO filler SELECT g, repeat('x', 1000) FROM generate_series(1, %d) g`, mbPerRound*900),
					`TRUNCATE filler`,
					`CHECKPOINT`, // also logs the running transactions the slot's restart point advances on
				} {
					if _, err := other.Exec(ctx, q); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(300 * time.Millisecond) // the quiet period: time passing, not synchronisation
			}
			var written int64
			if err := f.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0' - $1`, start).Scan(&written); err != nil {
				t.Fatal(err)
			}
			retained := func() int64 {
				var n int64
				if err := f.pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if heartbeat {
				// The slot's restart point follows within a heartbeat or two.
				wait.For(t, 10*time.Second, "retained WAL to stay small", func() bool {
					return retained() < written/4
				})
				wait.For(t, 5*time.Second, "the retained-bytes gauge", func() bool {
					v := promtest.Value(t, r.reg, "posthorn_wal_slot_retained_bytes", "slot", f.slot)
					return v > 0 && v < float64(written/4)
				})
				if promtest.Value(t, r.reg, "posthorn_cdc_heartbeats_total") == 0 {
					t.Error("no heartbeat was emitted")
				}
				t.Logf("heartbeat on: %d MB of foreign WAL written, slot retains %d kB", written>>20, retained()>>10)
				return
			}
			if n := retained(); n < written*3/4 {
				t.Fatalf("negative control: without heartbeat the slot retains only %d of %d bytes written", n, written)
			}
			t.Logf("heartbeat off: %d MB of foreign WAL written, slot retains %d MB", written>>20, retained()>>20)
		})
	}
}
