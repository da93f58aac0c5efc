package relaystore_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// insertRelayRow writes one outbox row for account after its row lock, as
// the write path does, and returns its id.
func insertRelayRow(t *testing.T, tx pgx.Tx, account string) core.RowRef {
	t.Helper()
	ctx := context.Background()
	var rev int64
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (id) VALUES ($1) ON CONFLICT DO NOTHING`, account); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `UPDATE accounts SET revision = revision + 1 WHERE id = $1 RETURNING revision`, account).Scan(&rev); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRow(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at, headers)
VALUES (gen_random_uuid(), 'event', $1, $2, 'account', $3, $4, $5, '{}', now(), '{"reference":"r-1"}') RETURNING id`,
		core.TypeAccountPosted, core.TopicEvents, account, rev, core.ShardOf(account)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return core.RowRef{ID: id, Shard: core.ShardOf(account)}
}

func commitRows(t *testing.T, pool *pgxpool.Pool, accounts ...string) []core.RowRef {
	t.Helper()
	var ids []core.RowRef
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		for _, a := range accounts {
			ids = append(ids, insertRelayRow(t, tx, a))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func allShards() []int {
	s := make([]int, core.Shards)
	for i := range s {
		s[i] = i
	}
	return s
}

func TestRelayStoreReadsUnrelayedInOrderAndSkipsParked(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	s := relaystore.New(pool)
	ctx := context.Background()
	ids := commitRows(t, pool, "acc-a", "acc-b", "acc-a", "acc-c")
	rows, err := s.ReadBatch(ctx, allShards(), 10, core.OrderByID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("read %d rows, want 4", len(rows))
	}
	for i, r := range rows {
		if r.ID != ids[i].ID {
			t.Fatalf("row %d has id %d, want %d (id order)", i, r.ID, ids[i])
		}
		if r.Envelope.Headers["reference"] != "r-1" || r.Envelope.Kind != core.KindEvent || r.Shard != core.ShardOf(r.Envelope.AggregateID) {
			t.Fatalf("row %d: %+v", i, r)
		}
	}
	if rows[2].Envelope.Revision != 2 {
		t.Fatalf("acc-a's second row has revision %d", rows[2].Envelope.Revision)
	}
	// Per-shard limit, and the skip list.
	rows, err = s.ReadBatchSkipping(ctx, []int{core.ShardOf("acc-a")}, 1, []int64{ids[0].ID}, core.OrderByID)
	if err != nil || len(rows) != 1 || rows[0].ID != ids[2].ID {
		t.Fatalf("skipping the first row of acc-a: %v %+v", err, rows)
	}
	if _, err := s.Park(ctx, core.ParkedAggregate{AggregateType: "account", AggregateID: "acc-a", EventID: rows[0].Envelope.EventID, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	rows, err = s.ReadBatch(ctx, allShards(), 10, core.OrderByID)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Envelope.AggregateID == "acc-a" {
			t.Fatalf("parked acc-a was read")
		}
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 4 || len(st.Parked) != 1 || st.OldestUnrelayedAge <= 0 || len(st.Shards) != core.Shards {
		t.Fatalf("status: %+v", st)
	}
	if err := s.Release(ctx, "account", "acc-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "account", "acc-a"); !errors.Is(err, core.ErrNotParked) {
		t.Fatalf("second release: %v", err)
	}
}

// The backlog gauge is read every 2 s, on the database the drain needs:
// its count reads the queue's primary key, and only each shard's first
// entry is looked up in the outbox, for the age. Control: the count that
// looked every pending row up for the oldest age touches the outbox for
// each of them.
func TestBacklogCountLooksUpOnlyEachShardsFirstRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	s := relaystore.New(pool)
	const backlog = 20000
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
SELECT gen_random_uuid(), 'event', 't', 't', 'account', 'acc-' || (g % 500), g, g % 16, '{}', now()
FROM generate_series(1, $1::int) g`, backlog); err != nil {
		t.Fatal(err)
	}
	// The first row of shard 3 is the oldest: the age is its own.
	if _, err := pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '1 hour'
WHERE id = (SELECT min(id) FROM outbox WHERE shard = 3)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) outbox, outbox_pending`); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != backlog || st.OldestUnrelayedAge < 3600 || st.OldestUnrelayedAge > 3700 {
		t.Fatalf("backlog %d (want %d), oldest age %.0f s (want an hour)", st.Backlog, backlog, st.OldestUnrelayedAge)
	}
	count, err := s.StatusBuffers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	probing, err := s.StatusBuffersProbingEachRow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one count of a backlog of %d: %d buffers, %d looking every row up", backlog, count, probing)
	if count > backlog/20 || probing < backlog {
		t.Fatalf("count: %d buffers, %d looking every row up: want under %d, and the control at least %d", count, probing, backlog/20, backlog)
	}
}

func TestRelayStoreLeasesAndFencing(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	s := relaystore.New(pool)
	ctx := context.Background()
	ttl := time.Minute

	a, err := s.AcquireLeases(ctx, "relay-a", core.Shards, nil, ttl)
	if err != nil || len(a) != core.Shards {
		t.Fatalf("A acquires: %v, %d leases", err, len(a))
	}
	if b, err := s.AcquireLeases(ctx, "relay-b", 4, nil, ttl); err != nil || len(b) != 0 {
		t.Fatalf("B acquires held leases: %v, %d", err, len(b))
	}
	renewed, err := s.RenewLeases(ctx, "relay-a", a, ttl)
	if err != nil || len(renewed) != core.Shards {
		t.Fatalf("A renews: %v %d", err, len(renewed))
	}

	ids := commitRows(t, pool, "acc-1", "acc-2", "acc-3")
	// A stalls: its leases expire and B takes them over with new tokens.
	if _, err := pool.Exec(ctx, `UPDATE relay_leases SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	b, err := s.AcquireLeases(ctx, "relay-b", core.Shards, nil, ttl)
	if err != nil || len(b) != core.Shards {
		t.Fatalf("B takes over: %v %d", err, len(b))
	}
	for _, l := range b {
		if l.PreviousOwner != "relay-a" {
			t.Fatalf("takeover of shard %d: previous owner %q", l.Shard, l.PreviousOwner)
		}
	}
	// A's stale token: every marker refused, and A's renewal finds nothing.
	marked, refused, err := s.MarkRelayed(ctx, ids, a)
	if err != nil || marked != 0 || refused != len(ids) {
		t.Fatalf("stale owner's marker: marked %d refused %d err %v; want all refused", marked, refused, err)
	}
	if renewed, err := s.RenewLeases(ctx, "relay-a", a, ttl); err != nil || len(renewed) != 0 {
		t.Fatalf("stale owner renews: %v %d", err, len(renewed))
	}
	// Negative control: the same marker with the current tokens is written.
	marked, refused, err = s.MarkRelayed(ctx, ids, b)
	if err != nil || marked != len(ids) || refused != 0 {
		t.Fatalf("current owner's marker: marked %d refused %d err %v", marked, refused, err)
	}
	// Release frees the shards at once, without a takeover.
	if err := s.ReleaseLeases(ctx, "relay-b", b); err != nil {
		t.Fatal(err)
	}
	c, err := s.AcquireLeases(ctx, "relay-c", 2, nil, ttl)
	if err != nil || len(c) != 2 || c[0].PreviousOwner != "" {
		t.Fatalf("after release: %v %+v", err, c)
	}
	// Live relays: heartbeats within the TTL.
	if n, err := s.Heartbeat(ctx, "relay-c", ttl); err != nil || n != 1 {
		t.Fatalf("heartbeat: %d %v", n, err)
	}
	if n, err := s.Heartbeat(ctx, "relay-d", ttl); err != nil || n != 2 {
		t.Fatalf("heartbeat: %d %v", n, err)
	}
}

func TestRelayStoreOldestOpenTransaction(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	s := relaystore.New(pool)
	ctx := context.Background()
	if age, err := s.OldestOpenTransactionAge(ctx); err != nil || age != 0 {
		t.Fatalf("no open transaction: %v %v", age, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	insertRelayRow(t, tx, "acc-open") // takes a transaction ID
	wait.For(t, 5*time.Second, "the open transaction with an xid to be seen", func() bool {
		age, err := s.OldestOpenTransactionAge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return age > 0
	})
}

// The work queue migration keeps the backlog: rows an older release had not
// marked become pending, marked ones do not, and from then on every insert
// into the outbox, whoever writes it, is enqueued by the trigger.
func TestOutboxPendingMigrationKeepsTheBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.LedgerAt(t, 4)
	pool := pgtest.Pool(t, dsn, 4)
	insert := func(account string, rev int, relayed bool) int64 {
		t.Helper()
		var id int64
		err := pool.QueryRow(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at, relayed_at)
VALUES (gen_random_uuid(), 'event', 't', 't', 'account', $1, $2, $3, '', now(), CASE WHEN $4 THEN now() END) RETURNING id`,
			account, rev, core.ShardOf(account), relayed).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	insert("acc-a", 1, true)
	a2 := insert("acc-a", 2, false)
	insert("acc-b", 1, true)
	b2 := insert("acc-b", 2, false)
	if err := postgres.Migrate(ctx, dsn, postgres.LedgerSchema); err != nil {
		t.Fatal(err)
	}
	pending := func() []int64 {
		t.Helper()
		return pgtest.Column[int64](t, pool, `SELECT id FROM outbox_pending ORDER BY id`)
	}
	if got := pending(); !slices.Equal(got, []int64{a2, b2}) {
		t.Fatalf("pending after the migration: %v, want the unrelayed %v", got, []int64{a2, b2})
	}
	// A multi-row insert by a writer that knows nothing of the queue.
	var n int
	if err := pool.QueryRow(ctx, `
WITH ins AS (
    INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
    SELECT gen_random_uuid(), 'event', 't', 't', 'account', 'acc-c', g, $1, '', now() FROM generate_series(1, 3) g
    RETURNING id)
SELECT count(*) FROM ins`, core.ShardOf("acc-c")).Scan(&n); err != nil || n != 3 {
		t.Fatalf("insert: %d %v", n, err)
	}
	var unqueued int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox o WHERE o.id > $1 AND `+opsstore.Relayed, b2).Scan(&unqueued); err != nil {
		t.Fatal(err)
	}
	if got := pending(); len(got) != 5 || unqueued != 0 {
		t.Fatalf("after inserting 3 rows: pending %v, %d new rows look relayed", got, unqueued)
	}
}
