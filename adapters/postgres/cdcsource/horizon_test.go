package cdcsource_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// unremovable vacuums the outbox's queue and returns how many of its dead
// row versions VACUUM reported it could not remove yet.
func unremovable(t *testing.T, url string) int {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `VACUUM (VERBOSE) outbox_pending`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	re := regexp.MustCompile(`(\d+) are dead but not yet removable`)
	for _, n := range notices {
		if m := re.FindStringSubmatch(n); m != nil {
			v, _ := strconv.Atoi(m[1])
			return v
		}
	}
	t.Fatalf("VACUUM VERBOSE said nothing of dead rows: %q", notices)
	return 0
}

// churn writes 500 outbox rows (aggregates prefix-1 …) and marks them
// relayed (the queue's entries are deleted).
func churn(t *testing.T, url, prefix string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
SELECT gen_random_uuid(), 'event', 't', 't', 'w', $1 || g, 1, 0, '{}', now() FROM generate_series(1, 500) g`, prefix); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM outbox_pending`); err != nil {
		t.Fatal(err)
	}
}

// The CDC relay's own replication slot never holds the ledger's data
// horizon back: a logical slot keeps only catalog_xmin (the system
// catalogs' versions it may need to decode), its xmin is NULL, and the
// queue entries deleted while it sits unconfirmed are removable at once.
// What does hold the horizon is named: a session that keeps a REPEATABLE
// READ snapshot open, by its application name and pid, with its age; and
// the entries deleted while it lives cannot be removed (the control that
// shows the VACUUM count sees a held horizon).
func TestTheCDCSlotNeverHoldsTheDataHorizon(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, url, pool := pgtest.LogicalLedger(t, pgcluster.Options{}, 4)
	src := cdcsource.New(pool)
	if _, err := src.CreateSlot(ctx, "horizon_slot"); err != nil {
		t.Fatal(err)
	}
	var xminNull, catalogHeld bool
	if err := pool.QueryRow(ctx, `SELECT xmin IS NULL, catalog_xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = 'horizon_slot'`).
		Scan(&xminNull, &catalogHeld); err != nil {
		t.Fatal(err)
	}
	store := relaystore.New(pool)
	churn(t, url, "a-")
	withSlot := unremovable(t, url)
	h, err := store.Horizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !xminNull || !catalogHeld || withSlot != 0 || h.Kind != "" {
		t.Fatalf("with the CDC slot unconfirmed: slot xmin NULL %v, catalog_xmin held %v, %d dead entries not removable, horizon %+v; want NULL, held, 0, none",
			xminNull, catalogHeld, withSlot, h)
	}

	report, err := pgx.Connect(ctx, url+"&application_name=nightly-report")
	if err != nil {
		t.Fatal(err)
	}
	defer report.Close(ctx)
	if _, err := report.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	if _, err := report.Exec(ctx, `SELECT count(*) FROM outbox`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // so the snapshot's age is measurable in seconds
	churn(t, url, "b-")
	held := unremovable(t, url)
	h, err = store.Horizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("with the CDC slot unconfirmed: %d dead queue entries not removable, no horizon holder; with a report's snapshot open: %d not removable, horizon %+v",
		withSlot, held, h)
	if held < 500 || h.Kind != "session" || !strings.HasPrefix(h.Holder, "nightly-report (pid ") || h.AgeSeconds < 1 || h.XIDAge < 1 {
		t.Fatalf("a report's snapshot: %d dead entries not removable (want 500 or more), horizon %+v (want the session named, at least 1 s old)", held, h)
	}
}
