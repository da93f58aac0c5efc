package relaystore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/internal/outboxrow"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/cdc"
	"github.com/posthorn/posthorn/relay/polling"
)

// Store is the relay's view of the ledger database: it reads unrelayed
// outbox rows, writes fenced markers, keeps shard leases and parks
// aggregates. It holds no transaction across calls; every method is one
// short statement (or one short transaction) and is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// low is each shard's low-water mark (lowwater.go); nil scans every
	// shard's queue from its start.
	low *lowWater
	// counted are the marks Status counts the backlog from, raised by its
	// own reads under the same rule, but never past a parked aggregate's
	// row, which low may pass (the read skips those, the count must not);
	// nil counts every shard's queue from its start.
	counted *lowWater
	// audit checks low against the ledger (audit.go).
	audit audit
}

// New returns a store over pool.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, low: newLowWater(), counted: newLowWater(),
		audit: audit{every: auditEvery, last: time.Now()}}
}

// readByID is one round trip over every owned shard; each lateral subquery is
// a range scan of the work queue outbox_pending (shard, id) from the shard's
// low-water mark ($4, lowwater.go), each row probed in the outbox's primary
// key, so its cost follows the batch, not the backlog, nor the queue's
// deleted entries that a long snapshot keeps from VACUUM. The probe is a lateral subquery behind OFFSET 0 so that the
// planner cannot turn it into a join of its choosing: planned while the
// outbox looked nearly empty (a busy start, before autovacuum analyzes it;
// pgx prepares the statement and the server keeps a generic plan), a join
// materialized a full outbox scan and compared every pending row with all
// of it, which cost seconds per read within ten seconds of the start.
// There is deliberately no "after id" cursor: a row whose transaction
// commits late has a smaller id than rows already relayed, and a cursor
// would step over it for good.
//
// The plan must stay that range scan whatever the statistics say, or a read
// costs the whole backlog: with a poor row estimate the planner may read the
// shard's whole queue through a bitmap scan and sort it. So the shard is
// matched with = ANY (ARRAY[x]), which keeps it out of the sort key's
// constants, the order asked for is (shard, id), which the queue's primary
// key delivers without a sort, and the read runs with enable_sort off (and
// jit off), which prices every plan that needs a sort out except the final
// merge by id. Parked aggregates, like the ids to skip ($3: rows of a
// published batch whose marker is still being written), are excluded with
// NOT IN, a hashed subplan built once per query.
var readByID = readPending("p.shard = ANY (ARRAY[s.shard])", "p.shard, p.id", "o.id")

// readByXID is readByID in transaction-ID order, for the negative control
// of the ordering test (core.OrderByXIDUnsafe).
var readByXID = readPending("p.shard = s.shard", "o.xid, o.id", "o.xid, o.id")

// readPending is the read of readByID and readByXID: up to $2 pending rows
// of each shard in $1 that matches shard, from the shard's mark in $4 on,
// in order per shard, then in order overall, skipping parked aggregates
// and the ids in $3.
func readPending(shard, order, overall string) string {
	return `
SELECT ` + outboxrow.Columns + `
FROM unnest($1::int[], $4::bigint[]) AS s(shard, low)
CROSS JOIN LATERAL (
    SELECT o.* FROM outbox_pending p
    CROSS JOIN LATERAL (SELECT * FROM outbox o WHERE o.id = p.id OFFSET 0) o
    WHERE ` + shard + ` AND p.id >= s.low
      AND (o.aggregate_type, o.aggregate_id) NOT IN (SELECT aggregate_type, aggregate_id FROM relay_parked)
      AND p.id NOT IN (SELECT unnest($3::bigint[]))
    ORDER BY ` + order + `
    LIMIT $2) o
ORDER BY ` + overall
}

// readHorizon is read before the batch, in the same transaction: the
// oldest transaction still running (every one below it has ended), the
// last outbox id the sequence gave out, the release generation, the
// server's history (system identifier and timeline: a failover or a
// restore changes it, and with it every counter a mark relies on), and, when
// $1 is a transaction ID, whether no transaction that holds the outbox's
// write lock is older than it (lowwater.go). A transaction that took an
// outbox id holds that lock, which an insert takes before its id, until it
// ends; one whose transaction ID is not older than $1 took it after the
// tick's last id was read, so only older ones can still hold an id below.
const readHorizon = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
       (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM outbox_id_seq),
       (SELECT generation FROM relay_release),
       h.system_identifier, h.timeline,
       $1::bigint > 0 AND NOT EXISTS (
           SELECT 1 FROM pg_locks AS r JOIN pg_locks AS x ON x.virtualtransaction = r.virtualtransaction
           WHERE r.locktype = 'relation' AND r.relation = 'outbox'::regclass AND r.mode = 'RowExclusiveLock'
             AND r.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND x.locktype = 'transactionid' AND age(x.transactionid) > age($1::text::xid8::xid))
FROM posthorn.ledger_history() AS h`

// readNextXID is read after the batch's transaction, in a transaction of
// its own: the next transaction ID to be assigned, which every transaction
// that took an id up to the last one readHorizon saw is below. It is the
// snapshot's oldest running transaction plus that one's age, since age()
// counts from the next transaction ID (read once per transaction, hence
// the transaction of its own). A snapshot's xmax will not do: it is the
// latest completed transaction plus one, and a transaction that is still
// running may hold a greater ID.
const readNextXID = `SELECT pg_snapshot_xmin(s)::text::bigint + age(pg_snapshot_xmin(s)::xid)
FROM (SELECT pg_current_snapshot() AS s) AS q`

// countFromMarks is per lease its owner and expiry, and the count, the
// first id and that row's age of the shard's pending entries from its mark
// in $2 on (a shard missing from $1 counts from its start). The count reads
// the queue's primary key alone; only the first entry is looked up in the
// outbox, for its age. The age is thus the first row's in the order the
// relay reads (an event whose transaction began earlier but took a later
// id may be older by as long as that transaction ran): looking every
// pending row up for the oldest made each refresh cost about four outbox
// buffers per pending row, read every 2 s on the same database the drain
// needs, and most of all while a backlog is being drained.
const countFromMarks = `
SELECT l.shard, coalesce(l.owner, ''), CASE WHEN l.owner IS NULL THEN NULL ELSE l.expires_at END,
       b.n, extract(epoch FROM now() - (SELECT o.created_at FROM outbox o WHERE o.id = b.first))::float8, b.first
FROM relay_leases l
LEFT JOIN unnest($1::int[], $2::bigint[]) AS s(shard, low) ON s.shard = l.shard
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(p.id) AS first
    FROM outbox_pending p
    WHERE p.shard = l.shard AND p.id >= coalesce(s.low, 0)) b
ORDER BY l.shard`

// markRelayed deletes the pending entries of the rows ($1 ids, $4 their
// shards) in the shards whose lease still carries this relay's token ($2
// shards, $3 tokens), share-locking those leases. Each entry is found by
// its own probe of the queue's primary key, behind OFFSET 0 so that the
// planner cannot turn the probes into a scan of the queue, and deleted by
// its tuple ID. With the queue as the statistics last saw it (nearly empty
// while the relay keeps up) a plain join was planned as a full scan of the
// queue's index joined to every id: under a long snapshot that index holds
// every deleted entry, and a marker of 5,000 rows compared 249 million
// pairs in 45 s. It runs with readSettings, which price a sequential scan
// of the queue out of the probe.
const markRelayed = `
WITH held AS (
    SELECT l.shard FROM relay_leases l
    JOIN unnest($2::int[], $3::bigint[]) AS h(shard, token) ON l.shard = h.shard AND l.token = h.token
    FOR SHARE OF l
)
DELETE FROM outbox_pending
WHERE ctid = ANY (ARRAY(
    SELECT q.ctid FROM unnest($1::bigint[], $4::int[]) AS m(id, shard)
    CROSS JOIN LATERAL (SELECT p.ctid FROM outbox_pending p WHERE p.shard = m.shard AND p.id = m.id OFFSET 0) q
    WHERE m.shard IN (SELECT shard FROM held)))`

// readSettings are set for the read's transaction only (see ReadBatchSkipping).
const readSettings = `SELECT set_config('enable_sort', 'off', true), set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)`

// ReadBatch returns up to perShard unrelayed rows of each shard in shards,
// skipping parked aggregates, in order.
func (s *Store) ReadBatch(ctx context.Context, shards []int, perShard int, order core.ReadOrder) ([]core.OutboxRow, error) {
	return s.ReadBatchSkipping(ctx, shards, perShard, nil, order)
}

// ReadBatchSkipping is ReadBatch that also skips the rows whose ids are in
// skip (a published batch whose marker is still being written).
func (s *Store) ReadBatchSkipping(ctx context.Context, shards []int, perShard int, skip []int64, order core.ReadOrder) ([]core.OutboxRow, error) {
	q := readByID
	if order == core.OrderByXIDUnsafe {
		q = readByXID
	}
	if skip == nil {
		skip = []int64{}
	}
	if err := s.audit.report(); err != nil {
		return nil, fmt.Errorf("read outbox batch: %w", err)
	}
	// A read from marks that no longer hold is thrown away; the second
	// starts from none, so it is whole.
	for {
		lows, gen := s.low.marks(shards)
		ask, askGen := s.low.writersBefore()
		out, h, err := s.readBatch(ctx, q, shards, perShard, skip, lows, ask)
		if err != nil {
			return nil, fmt.Errorf("read outbox batch: %w", err)
		}
		h.writersGen = askGen
		if s.low.advance(shards, lows, gen, out, skip, h) {
			s.auditMarks(ctx, shards)
			return out, nil
		}
	}
}

// readBatch runs the read q from the marks lows under the horizon
// (readUnderHorizon), asking about the outbox's writers older than the
// next transaction ID of the tick writers, unless it is the zero tick.
func (s *Store) readBatch(ctx context.Context, q string, shards []int, perShard int, skip, lows []int64, writers tick) ([]core.OutboxRow, horizon, error) {
	var out []core.OutboxRow
	h, err := s.readUnderHorizon(ctx, s.low, writers, func(rows pgx.Rows) (err error) {
		out, err = scanOutboxRows(rows)
		return err
	}, q, toInt32(shards), perShard, skip, lows)
	return out, h, err
}

// readUnderHorizon runs q with args in one read-only transaction after the
// read's settings and readHorizon (asking about writers), then, in a
// transaction of its own, readNextXID: one round trip. scan reads q's rows
// and closes them; lw's unsafe switches apply.
func (s *Store) readUnderHorizon(ctx context.Context, lw *lowWater, writers tick, scan func(pgx.Rows) error, q string, args ...any) (horizon, error) {
	var h horizon
	b := &pgx.Batch{}
	b.Queue("BEGIN READ ONLY")
	// enable_sort off: see readByID. enable_seqscan off: with statistics
	// from a nearly empty table (a busy start; autovacuum may not analyze
	// for a minute) the planner would otherwise probe the outbox with a
	// scan of the whole table for each row. jit off as well: the price
	// put on disabled plans would otherwise push the plan's cost over
	// jit_above_cost, and compiling takes longer than the read.
	b.Queue(readSettings)
	b.Queue(readHorizon, writers.next)
	b.Queue(q, args...)
	b.Queue("COMMIT")
	if lw != nil && lw.unsafe.xmaxAsNext {
		b.Queue(`SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`)
	} else {
		b.Queue(readNextXID)
	}
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return h, err
		}
	}
	h.writers = writers
	if err := br.QueryRow().Scan(&h.xmin, &h.last, &h.release, &h.history.system, &h.history.timeline, &h.noWriterBefore); err != nil {
		return h, err
	}
	rows, err := br.Query()
	if err != nil {
		return h, err
	}
	if err := scan(rows); err != nil {
		return h, err
	}
	if _, err := br.Exec(); err != nil {
		return h, err
	}
	if err := br.QueryRow().Scan(&h.next); err != nil {
		return h, err
	}
	return h, br.Close()
}

func scanOutboxRows(rows pgx.Rows) ([]core.OutboxRow, error) {
	defer rows.Close()
	var out []core.OutboxRow
	for rows.Next() {
		var r outboxrow.Scan
		if err := rows.Scan(r.Dest()...); err != nil {
			return nil, err
		}
		row, err := r.Decode()
		if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// Heartbeat records owner as live and returns how many relays are live
// (heartbeat within ttl), itself included.
func (s *Store) Heartbeat(ctx context.Context, owner string, ttl time.Duration) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `
WITH beat AS (
    INSERT INTO relay_members (owner, seen_at) VALUES ($1, now())
    ON CONFLICT (owner) DO UPDATE SET seen_at = now()
)
SELECT count(*) + 1 FROM relay_members WHERE owner <> $1 AND seen_at > now() - $2::interval`,
		owner, ttl).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("relay heartbeat: %w", err)
	}
	return n, nil
}

// RenewLeases extends the leases of held that owner still holds with the
// same token and returns those; a lease missing from the result was lost.
func (s *Store) RenewLeases(ctx context.Context, owner string, held []core.Lease, ttl time.Duration) ([]core.Lease, error) {
	if len(held) == 0 {
		return nil, nil
	}
	shards, tokens := leaseArrays(held)
	rows, err := s.pool.Query(ctx, `
UPDATE relay_leases l SET expires_at = now() + $4::interval
FROM unnest($2::int[], $3::bigint[]) AS h(shard, token)
WHERE l.shard = h.shard AND l.token = h.token AND l.owner = $1
RETURNING l.shard, l.token`, owner, shards, tokens, ttl)
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (core.Lease, error) {
		var l core.Lease
		err := r.Scan(&l.Shard, &l.Token)
		return l, err
	})
}

// AcquireLeases takes up to n shards, other than those in held, that are
// free, expired, or held by owner itself under an older grant (a restarted
// process), each with a new fencing token. Contended rows are skipped,
// never waited for.
func (s *Store) AcquireLeases(ctx context.Context, owner string, n int, held []int, ttl time.Duration) ([]core.Lease, error) {
	if n <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
WITH pick AS (
    SELECT shard, owner AS prev FROM relay_leases
    WHERE (owner IS NULL OR expires_at < now() OR owner = $1) AND NOT shard = ANY($4::int[])
    ORDER BY shard
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE relay_leases l
SET owner = $1, token = nextval('relay_fencing_token'), expires_at = now() + $3::interval
FROM pick WHERE l.shard = pick.shard
RETURNING l.shard, l.token, coalesce(pick.prev, '')`, owner, n, ttl, toInt32(held))
	if err != nil {
		return nil, fmt.Errorf("acquire leases: %w", err)
	}
	leases, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (core.Lease, error) {
		var l core.Lease
		err := r.Scan(&l.Shard, &l.Token, &l.PreviousOwner)
		if l.PreviousOwner == owner {
			l.PreviousOwner = ""
		}
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("acquire leases: %w", err)
	}
	return leases, nil
}

// ReleaseLeases frees the given leases if owner still holds them under the
// same tokens, so another relay can take them at once.
func (s *Store) ReleaseLeases(ctx context.Context, owner string, held []core.Lease) error {
	if len(held) == 0 {
		return nil
	}
	shards, tokens := leaseArrays(held)
	_, err := s.pool.Exec(ctx, `
UPDATE relay_leases l SET owner = NULL, expires_at = '-infinity'
FROM unnest($2::int[], $3::bigint[]) AS h(shard, token)
WHERE l.shard = h.shard AND l.token = h.token AND l.owner = $1`, owner, shards, tokens)
	if err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

// Leave removes owner from the live relays (on a clean stop).
func (s *Store) Leave(ctx context.Context, owner string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM relay_members WHERE owner = $1`, owner)
	return err
}

// MarkRelayed writes the marker of the rows refs, which the sink ACKed: it
// deletes their pending rows, but only in shards whose lease still carries
// the token this relay holds (fencing): a relay that lost its lease cannot
// mark rows the new owner is responsible for. The lease rows are
// share-locked for the statement, so a concurrent takeover either waits for
// the marker or the marker sees the new token. It returns how many rows
// were marked and how many were refused.
func (s *Store) MarkRelayed(ctx context.Context, refs []core.RowRef, held []core.Lease) (marked, refused int, err error) {
	if len(refs) == 0 {
		return 0, 0, nil
	}
	shards, tokens := leaseArrays(held)
	ids := make([]int64, len(refs))
	rowShards := make([]int32, len(refs))
	for i, r := range refs {
		ids[i], rowShards[i] = r.ID, int32(r.Shard)
	}
	// One round trip: the settings hold for the marker's transaction only.
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(readSettings)
	b.Queue(markRelayed, ids, shards, tokens, rowShards)
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	for i := range 4 {
		t, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return 0, 0, fmt.Errorf("write relay markers: %w", err)
		}
		if i == 2 {
			tag = t
		}
	}
	if err := br.Close(); err != nil {
		return 0, 0, fmt.Errorf("write relay markers: %w", err)
	}
	marked = int(tag.RowsAffected())
	return marked, len(refs) - marked, nil
}

func toInt32(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

func leaseArrays(held []core.Lease) ([]int32, []int64) {
	shards := make([]int32, len(held))
	tokens := make([]int64, len(held))
	for i, l := range held {
		shards[i], tokens[i] = int32(l.Shard), l.Token
	}
	return shards, tokens
}

// first reason. It reports whether the aggregate was newly parked.
func (s *Store) Park(ctx context.Context, p core.ParkedAggregate) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
INSERT INTO relay_parked (aggregate_type, aggregate_id, event_id, reason)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, p.AggregateType, p.AggregateID, p.EventID, p.Reason)
	if err != nil {
		return false, fmt.Errorf("park %s %s: %w", p.AggregateType, p.AggregateID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release lets the relay read a parked aggregate again, starting with the
// record that was rejected.
func (s *Store) Release(ctx context.Context, aggregateType, aggregateID string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM relay_parked WHERE aggregate_type = $1 AND aggregate_id = $2`,
		aggregateType, aggregateID)
	if err != nil {
		return fmt.Errorf("release %s %s: %w", aggregateType, aggregateID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s %s: %w", aggregateType, aggregateID, core.ErrNotParked)
	}
	return nil
}

// Status reports the backlog (unrelayed rows, parked aggregates' rows
// included), the age of the oldest unrelayed row, the leases and the
// parked aggregates, the ledger's history and what holds its horizon.
//
// The count starts at marks of its own (counted), raised by earlier
// counts of this store under the read's rule, so it does not walk the
// queue's entries that the markers deleted and that a long snapshot keeps
// from VACUUM: its cost follows the backlog, not the snapshot's age. A
// store's first count, as in a one-off outbox status, walks each shard
// from its start.
func (s *Store) Status(ctx context.Context) (core.OutboxStatus, error) {
	shards := make([]int, core.Shards)
	for i := range shards {
		shards[i] = i
	}
	var st core.OutboxStatus
	// A count from marks that no longer hold is thrown away, as a read
	// is (ReadBatchSkipping); the second starts from none.
	for {
		lows, gen := s.counted.marks(shards)
		ask, askGen := s.counted.writersBefore()
		var (
			firsts []core.OutboxRow
			h      horizon
			err    error
		)
		st, firsts, h, err = s.countBacklog(ctx, shards, lows, ask)
		if err != nil {
			return st, fmt.Errorf("outbox status: %w", err)
		}
		h.writersGen = askGen
		if s.counted.advance(shards, lows, gen, firsts, nil, h) {
			break
		}
	}
	var err error
	if st.Parked, err = s.Parked(ctx); err != nil {
		return st, err
	}
	h, err := postgres.ReadHistory(ctx, s.pool)
	if err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	st.History = &h
	hz, err := s.Horizon(ctx)
	if err != nil {
		return st, fmt.Errorf("outbox status: %w", err)
	}
	if hz.Kind != "" {
		st.Horizon = &hz
	}
	return st, nil
}

// countBacklog is a read of the backlog under the horizon
// (readUnderHorizon): per lease its owner, and the count, the first id and
// its age of the pending entries from the shard's mark in lows on
// (countFromMarks). firsts holds each shard's first pending row
// (id and shard only), parked or not, for the marks to rise to.
func (s *Store) countBacklog(ctx context.Context, shards []int, lows []int64, writers tick) (st core.OutboxStatus, firsts []core.OutboxRow, h horizon, err error) {
	h, err = s.readUnderHorizon(ctx, s.counted, writers, func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var (
				sl    core.ShardLease
				age   pgtype.Float8
				first pgtype.Int8
			)
			if err := rows.Scan(&sl.Shard, &sl.Owner, &sl.ExpiresAt, &sl.Backlog, &age, &first); err != nil {
				return err
			}
			st.Backlog += sl.Backlog
			if age.Valid && age.Float64 > st.OldestUnrelayedAge {
				st.OldestUnrelayedAge = age.Float64
			}
			if first.Valid {
				firsts = append(firsts, core.OutboxRow{RowRef: core.RowRef{ID: first.Int64, Shard: sl.Shard}})
			}
			st.Shards = append(st.Shards, sl)
		}
		return rows.Err()
	}, countFromMarks, toInt32(shards), lows)
	return st, firsts, h, err
}

// Parked lists the parked aggregates, oldest first.
func (s *Store) Parked(ctx context.Context) ([]core.ParkedAggregate, error) {
	rows, err := s.pool.Query(ctx, `
SELECT aggregate_type, aggregate_id, event_id::text, reason, parked_at FROM relay_parked ORDER BY parked_at, aggregate_id`)
	if err != nil {
		return nil, fmt.Errorf("parked aggregates: %w", err)
	}
	parked, err := pgx.CollectRows(rows, pgx.RowToStructByPos[core.ParkedAggregate])
	if err != nil {
		return nil, fmt.Errorf("parked aggregates: %w", err)
	}
	if parked == nil {
		parked = []core.ParkedAggregate{}
	}
	return parked, nil
}

// OldestOpenTransactionAge is the age of the oldest open transaction in this
// database that holds a transaction ID, the relay's own sessions excluded.
// Such a transaction may have inserted outbox rows that are not visible yet,
// so the relay may be held back behind it (it does not wait, it just cannot
// see the rows); zero means nothing is held back.
func (s *Store) OldestOpenTransactionAge(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := s.pool.QueryRow(ctx, `
SELECT coalesce(extract(epoch FROM now() - min(xact_start)), 0)::float8
FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL
  AND pid <> pg_backend_pid() AND application_name <> $1`, postgres.RelayApplicationName).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("open transaction age: %w", err)
	}
	if secs < 0 {
		secs = 0
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// Listen waits for outbox notifications (NotifyChannel) on a connection of
// its own, calling notify once when it listens and once per notification,
// until ctx ends or the connection fails.
func (s *Store) Listen(ctx context.Context, notify func()) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection leaves the pool: a cancelled wait may leave it unusable.
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+postgres.NotifyChannel); err != nil {
		return err
	}
	notify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		notify()
	}
}

var (
	_ polling.Store   = (*Store)(nil)
	_ cdc.OutboxStore = (*Store)(nil)
)
