package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// OpsStore is the operators' view of the ledger database: cuts for
// reconciliation, verified coverage, archive segments, the cleanup floor,
// replay progress, resend and uncertain rows (migration 00003_ops). Each
// method is one short statement or transaction, except a Cut, which is one
// read-only REPEATABLE READ transaction held until Close.
type OpsStore struct {
	pool *pgxpool.Pool
}

// NewOpsStore returns the store over the ledger pool.
func NewOpsStore(pool *pgxpool.Pool) *OpsStore { return &OpsStore{pool: pool} }

// Pool is the ledger pool.
func (s *OpsStore) Pool() *pgxpool.Pool { return s.pool }

// ErrCutNotProvable is returned by OpenCut when a cut cannot be proven
// complete: it lies beyond the last committed sequence, or a transaction
// that may still commit a sequence at or below it did not finish in time.
var ErrCutNotProvable = errors.New("cut not provable")

// CutRequest selects a cut. At most one of Sequence and Time is set; none
// means "now": the last committed journal sequence.
type CutRequest struct {
	Sequence int64
	Time     time.Time
	// Settle bounds the wait for in-flight transactions (default 10s).
	Settle time.Duration
}

// Cut is a consistent, provably complete view of the ledger up to journal
// sequence Sequence: every journal with sequence <= Sequence that will ever
// commit is visible in it.
//
// How it is proven. journals.sequence is taken by the posting's last
// statement, so a transaction may hold a smaller sequence than one already
// committed while it is still in flight. OpenCut reads (1) the outbox id
// sequence's last value L, (2) the last committed journal sequence M (and
// the cut N <= M), then (3) the transactions of this database that hold a
// transaction ID, and waits until each of them has ended. A transaction that
// holds a sequence <= N took it before M was committed, so it had its
// transaction ID before (3) and is waited for; likewise any writer of an
// outbox id <= L (a posting writes its accounts before the outbox, so it
// has its transaction ID before taking an outbox id). Only then is the
// snapshot taken, so it contains every journal <= N and every outbox row
// with id <= L that will ever commit.
type Cut struct {
	tx pgx.Tx
	// Sequence is the cut N; LastCommitted is M.
	Sequence      int64
	LastCommitted int64
	// Floor is the cleanup's journal floor: journals at or below it have no
	// outbox rows left and are outside reconciliation.
	Floor int64
	// OutboxIDLimit is L: every outbox row with id <= L is final in the cut.
	OutboxIDLimit int64
	// TakenAt is the database time of the snapshot.
	TakenAt time.Time
	// Waited is how long OpenCut waited for in-flight transactions.
	Waited time.Duration
}

// OpenCut proves and opens a cut (see Cut). It returns ErrCutNotProvable
// (wrapped, with the reason) when the cut lies beyond the last committed
// sequence or in-flight transactions did not end within req.Settle.
func (s *OpsStore) OpenCut(ctx context.Context, req CutRequest) (*Cut, error) {
	if req.Settle <= 0 {
		req.Settle = 10 * time.Second
	}
	var limit, last int64
	if err := s.pool.QueryRow(ctx, `
SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_id_seq),
       (SELECT coalesce(max(sequence), 0) FROM journals)`).Scan(&limit, &last); err != nil {
		return nil, fmt.Errorf("open cut: %w", err)
	}
	n := last
	switch {
	case req.Sequence > 0:
		if req.Sequence > last {
			return nil, fmt.Errorf("%w: cut %d is beyond the last committed journal sequence %d", ErrCutNotProvable, req.Sequence, last)
		}
		n = req.Sequence
	case !req.Time.IsZero():
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(sequence), 0) FROM journals WHERE posted_at <= $1`, req.Time).Scan(&n); err != nil {
			return nil, fmt.Errorf("open cut: %w", err)
		}
	}
	start := time.Now()
	if err := s.awaitInFlight(ctx, req.Settle); err != nil {
		return nil, err
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("open cut: %w", err)
	}
	c := &Cut{tx: tx, Sequence: n, LastCommitted: last, OutboxIDLimit: limit, Waited: time.Since(start)}
	err = tx.QueryRow(ctx, `SELECT now(), coalesce((SELECT journal_floor FROM ops_cleanup), 0)`).Scan(&c.TakenAt, &c.Floor)
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("open cut: %w", err)
	}
	return c, nil
}

// awaitInFlight waits until every transaction of this database that holds
// a transaction ID now has ended.
func (s *OpsStore) awaitInFlight(ctx context.Context, settle time.Duration) error {
	rows, err := s.pool.Query(ctx, `
SELECT pid, backend_xid::text FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()`)
	if err != nil {
		return fmt.Errorf("open cut: in-flight transactions: %w", err)
	}
	type inflight struct {
		pid int32
		xid string
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inflight, error) {
		var f inflight
		return f, r.Scan(&f.pid, &f.xid)
	})
	if err != nil {
		return fmt.Errorf("open cut: in-flight transactions: %w", err)
	}
	if len(list) == 0 {
		return nil
	}
	pids, xids := make([]int32, len(list)), make([]string, len(list))
	for i, f := range list {
		pids[i], xids[i] = f.pid, f.xid
	}
	deadline := time.Now().Add(settle)
	for wait := 2 * time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		var still []int32
		rows, err := s.pool.Query(ctx, `
SELECT a.pid FROM pg_stat_activity a
JOIN unnest($1::int[], $2::text[]) AS f(pid, xid) ON a.pid = f.pid AND a.backend_xid::text = f.xid`, pids, xids)
		if err == nil {
			still, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		}
		if err != nil {
			return fmt.Errorf("open cut: in-flight transactions: %w", err)
		}
		if len(still) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d transaction(s) of the ledger database still in progress after %s (backend pid %v); "+
				"one of them may commit a journal at or below the cut", ErrCutNotProvable, len(still), settle, still)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// Close ends the cut's transaction.
func (c *Cut) Close() { _ = c.tx.Rollback(context.Background()) }

// JournalLine names one journal line by its journal and account revision.
type JournalLine struct {
	JournalID string `json:"journal_id"`
	Sequence  int64  `json:"sequence"`
	Account   string `json:"account"`
	Revision  int64  `json:"revision"`
}

// LinesWithoutEvents returns journal lines of the cut (above the floor)
// that have no ledger.account.posted outbox row of the same account
// revision and journal: up to limit of them, and how many there are.
func (c *Cut) LinesWithoutEvents(ctx context.Context, limit int) ([]JournalLine, int64, error) {
	limit = max(limit, 1) // the count comes with the rows
	rows, err := c.tx.Query(ctx, `
SELECT j.id::text, j.sequence, l.account_id, l.revision, count(*) OVER ()
FROM journals j JOIN journal_lines l ON l.journal_id = j.id
WHERE j.sequence > $1 AND j.sequence <= $2
  AND NOT EXISTS (SELECT 1 FROM outbox o
                  WHERE o.aggregate_type = $3 AND o.aggregate_id = l.account_id AND o.revision = l.revision
                    AND o.journal_id = j.id AND o.kind = 'event')
ORDER BY j.sequence, l.line_no
LIMIT $4`, c.Floor, c.Sequence, core.AggregateAccount, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("lines without events: %w", err)
	}
	var out []JournalLine
	var total int64
	for rows.Next() {
		var l JournalLine
		if err := rows.Scan(&l.JournalID, &l.Sequence, &l.Account, &l.Revision, &total); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("lines without events: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("lines without events: %w", err)
	}
	return out, total, nil
}

// CoveredOutboxID is the largest outbox id X such that every outbox row
// with id <= X is final and belongs to a journal of the cut: the first row
// of a later journal (or of none) bounds it, and so does OutboxIDLimit.
func (c *Cut) CoveredOutboxID(ctx context.Context) (int64, error) {
	var first pgtype.Int8
	err := c.tx.QueryRow(ctx, `
SELECT o.id FROM outbox o
WHERE NOT EXISTS (SELECT 1 FROM journals j WHERE j.id = o.journal_id AND j.sequence <= $1)
ORDER BY o.id LIMIT 1`, c.Sequence).Scan(&first)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("covered outbox id: %w", err)
	}
	x := c.OutboxIDLimit
	if first.Valid && first.Int64-1 < x {
		x = first.Int64 - 1
	}
	return max(x, 0), nil
}

// Relayed is an SQL condition on the outbox row aliased o: true once a sink
// has ACKed the row and its marker was written, that is, its entry in the
// relay's work queue outbox_pending is gone (see migration 00005).
const Relayed = `NOT EXISTS (SELECT 1 FROM outbox_pending p WHERE p.shard = o.shard AND p.id = o.id)`

// ExpectedEvent is one event of the cut that every consumer should have.
type ExpectedEvent struct {
	ID        int64
	EventID   string
	Sequence  int64
	CreatedAt time.Time
	Relayed   bool
	// The aggregate and revision, for telling a pruned inbox row
	// (Inbox.Pruned) from a missing one.
	AggregateType string
	AggregateID   string
	Revision      int64
}

// ExpectedEvents returns up to limit events (kind event) of the cut's
// journals above the floor with outbox id > after, in id order.
func (c *Cut) ExpectedEvents(ctx context.Context, after int64, limit int) ([]ExpectedEvent, error) {
	rows, err := c.tx.Query(ctx, `
SELECT o.id, o.event_id::text, j.sequence, o.created_at, `+Relayed+`, o.aggregate_type, o.aggregate_id, o.revision
FROM outbox o JOIN journals j ON j.id = o.journal_id
WHERE o.id > $1 AND o.kind = 'event' AND j.sequence > $2 AND j.sequence <= $3
ORDER BY o.id LIMIT $4`, after, c.Floor, c.Sequence, limit)
	if err != nil {
		return nil, fmt.Errorf("expected events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExpectedEvent, error) {
		var e ExpectedEvent
		return e, r.Scan(&e.ID, &e.EventID, &e.Sequence, &e.CreatedAt, &e.Relayed, &e.AggregateType, &e.AggregateID, &e.Revision)
	})
	if err != nil {
		return nil, fmt.Errorf("expected events: %w", err)
	}
	return out, nil
}

// UnknownEventIDs returns those of ids that no outbox row carries, read
// now (not in a cut: a consumer may have recorded an event committed after
// the cut's snapshot, and it must not look unknown). An ID that is not a
// UUID is unknown by definition.
func (s *OpsStore) UnknownEventIDs(ctx context.Context, ids []string) ([]string, error) {
	var unknown []string
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil || u.String() != id {
			unknown = append(unknown, id)
			continue
		}
		valid = append(valid, id)
	}
	if len(valid) == 0 {
		return unknown, nil
	}
	rows, err := s.pool.Query(ctx, `
SELECT u FROM unnest($1::text[]) AS u
WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = u::uuid)`, valid)
	if err != nil {
		return nil, fmt.Errorf("unknown event ids: %w", err)
	}
	more, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("unknown event ids: %w", err)
	}
	return append(unknown, more...), nil
}

// Coverage is a consumer's last verified boundary.
type Coverage struct {
	Consumer        string    `json:"consumer"`
	CutSequence     int64     `json:"cut_sequence"`
	CoveredOutboxID int64     `json:"covered_outbox_id"`
	VerifiedAt      time.Time `json:"verified_at"`
}

// RecordCoverage advances the consumer's verified boundary (never lowers
// it) and returns the boundary now recorded.
func (s *OpsStore) RecordCoverage(ctx context.Context, consumer string, cut, coveredID int64) (Coverage, error) {
	c := Coverage{Consumer: consumer}
	err := s.pool.QueryRow(ctx, `
INSERT INTO ops_coverage AS c (consumer, cut_sequence, covered_outbox_id) VALUES ($1, $2, $3)
ON CONFLICT (consumer) DO UPDATE
   SET cut_sequence = greatest(c.cut_sequence, EXCLUDED.cut_sequence),
       covered_outbox_id = greatest(c.covered_outbox_id, EXCLUDED.covered_outbox_id),
       verified_at = now()
RETURNING cut_sequence, covered_outbox_id, verified_at`, consumer, cut, coveredID).Scan(&c.CutSequence, &c.CoveredOutboxID, &c.VerifiedAt)
	if err != nil {
		return c, fmt.Errorf("record coverage of %s: %w", consumer, err)
	}
	return c, nil
}

// Coverages returns every consumer's verified boundary, by name.
func (s *OpsStore) Coverages(ctx context.Context) (map[string]Coverage, error) {
	rows, err := s.pool.Query(ctx, `SELECT consumer, cut_sequence, covered_outbox_id, verified_at FROM ops_coverage`)
	if err != nil {
		return nil, fmt.Errorf("coverage: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Coverage])
	if err != nil {
		return nil, fmt.Errorf("coverage: %w", err)
	}
	out := make(map[string]Coverage, len(list))
	for _, c := range list {
		out[c.Consumer] = c
	}
	return out, nil
}

// StoredRow is one outbox row with everything archive, replay and resend
// need.
type StoredRow struct {
	ID       int64
	Shard    int
	Envelope core.Envelope
	// JournalSequence is 0 for a row without a journal.
	JournalSequence int64
	CreatedAt       time.Time
	Relayed         bool
}

// RowFilter selects outbox rows. Zero fields do not filter.
type RowFilter struct {
	// AfterID and ThroughID bound the outbox id: AfterID < id <= ThroughID
	// (ThroughID 0: no upper bound).
	AfterID, ThroughID int64
	// SequenceFrom and SequenceTo bound the journal sequence (inclusive).
	SequenceFrom, SequenceTo int64
	// From and To bound occurred_at: From <= occurred_at < To.
	From, To time.Time
	// Account keeps only rows of this account.
	Account string
	// EventsOnly drops commands.
	EventsOnly bool
	// RelayedOnly keeps only rows with a marker.
	RelayedOnly bool
	// EventIDs keeps only these event IDs.
	EventIDs []string
}

const storedColumns = `o.id, o.shard, o.event_id::text, o.kind, o.type, o.topic, o.aggregate_type, o.aggregate_id,
       o.revision, coalesce(o.journal_id::text, ''), o.headers, o.payload, o.occurred_at,
       coalesce(j.sequence, 0), o.created_at, ` + Relayed

// rowFilterWhere is the filter of ReadRows and CountRows. The journal is
// joined laterally (one index lookup per outbox row) so that the keyset
// read "id > after ORDER BY id LIMIT n" stays an index range scan whatever
// the planner believes about the tables' sizes (a generic plan over stale
// statistics otherwise hash-joins the whole outbox for every batch).
const rowFilterWhere = `o.id > $1 AND o.id <= $2
  AND ($3 = 0 OR j.sequence >= $3) AND ($4 = 0 OR j.sequence <= $4)
  AND ($5::timestamptz IS NULL OR o.occurred_at >= $5) AND ($6::timestamptz IS NULL OR o.occurred_at < $6)
  AND ($7 = '' OR (o.aggregate_type = 'account' AND o.aggregate_id = $7))
  AND (NOT $8 OR o.kind = 'event') AND (NOT $9 OR ` + Relayed + `)
  AND ($10::text[] IS NULL OR o.event_id = ANY($10::text[]::uuid[]))`

// CountRows counts the rows matching f.
func (s *OpsStore) CountRows(ctx context.Context, f RowFilter) (int64, error) {
	args := f.args()
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox o LEFT JOIN LATERAL (SELECT sequence FROM journals WHERE id = o.journal_id) j ON true WHERE `+rowFilterWhere, args...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count outbox rows: %w", err)
	}
	return n, nil
}

func (f RowFilter) args() []any {
	through := f.ThroughID
	if through <= 0 {
		through = 1<<63 - 1
	}
	var eventIDs []string
	if f.EventIDs != nil {
		eventIDs = make([]string, 0, len(f.EventIDs))
		for _, id := range f.EventIDs {
			if u, err := uuid.Parse(id); err == nil {
				eventIDs = append(eventIDs, u.String()) // others cannot match any row
			}
		}
	}
	var from, to *time.Time
	if !f.From.IsZero() {
		from = &f.From
	}
	if !f.To.IsZero() {
		to = &f.To
	}
	return []any{f.AfterID, through, f.SequenceFrom, f.SequenceTo, from, to, f.Account, f.EventsOnly, f.RelayedOnly, eventIDs}
}

// ReadRows returns up to limit rows matching f, in id order.
func (s *OpsStore) ReadRows(ctx context.Context, f RowFilter, limit int) ([]StoredRow, error) {
	args := append(f.args(), limit)
	rows, err := s.pool.Query(ctx, `
SELECT `+storedColumns+`
FROM outbox o LEFT JOIN LATERAL (SELECT sequence FROM journals WHERE id = o.journal_id) j ON true
WHERE `+rowFilterWhere+`
ORDER BY o.id LIMIT $11`, args...)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows: %w", err)
	}
	defer rows.Close()
	var out []StoredRow
	for rows.Next() {
		var (
			r       StoredRow
			e       = &r.Envelope
			kind    string
			headers []byte
		)
		if err := rows.Scan(&r.ID, &r.Shard, &e.EventID, &kind, &e.Type, &e.Topic, &e.AggregateType, &e.AggregateID,
			&e.Revision, &e.JournalID, &headers, &e.Payload, &e.OccurredAt, &r.JournalSequence, &r.CreatedAt, &r.Relayed); err != nil {
			return nil, fmt.Errorf("read outbox rows: %w", err)
		}
		e.Kind = core.Kind(kind)
		if len(headers) > 0 && string(headers) != "{}" {
			if err := json.Unmarshal(headers, &e.Headers); err != nil {
				return nil, fmt.Errorf("outbox row %d: headers: %w", r.ID, err)
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read outbox rows: %w", err)
	}
	return out, nil
}

// MarkResent writes the marker of rows ids that a resend got ACKed and that
// are still unrelayed (deletes their pending rows). It is not fenced: the
// resend holds no lease. A relay sending the same rows concurrently only
// repeats them, which the inbox absorbs.
func (s *OpsStore) MarkResent(ctx context.Context, ids []int64) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM outbox_pending p USING outbox o
WHERE o.id = ANY($1) AND p.shard = o.shard AND p.id = o.id`, ids)
	if err != nil {
		return 0, fmt.Errorf("write resend markers: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// UnrelayedPredecessor is an unrelayed row that precedes a row to be resent
// in its aggregate.
type UnrelayedPredecessor struct {
	ID       int64
	EventID  string
	Revision int64
}

// FirstUnrelayedBefore returns, for the aggregate, the first unrelayed row
// with id < beforeID, if any.
func (s *OpsStore) FirstUnrelayedBefore(ctx context.Context, aggregateType, aggregateID string, beforeID int64) (*UnrelayedPredecessor, error) {
	var p UnrelayedPredecessor
	err := s.pool.QueryRow(ctx, `
SELECT o.id, o.event_id::text, o.revision FROM outbox o
WHERE o.aggregate_type = $1 AND o.aggregate_id = $2 AND o.id < $3 AND NOT `+Relayed+`
ORDER BY o.id LIMIT 1`, aggregateType, aggregateID, beforeID).Scan(&p.ID, &p.EventID, &p.Revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("unrelayed predecessor: %w", err)
	}
	return &p, nil
}

// UncertainRow is an unrelayed row that a relay may have published without
// writing the marker.
type UncertainRow struct {
	ID          int64     `json:"id"`
	EventID     string    `json:"event_id"`
	Shard       int       `json:"shard"`
	Account     string    `json:"account"`
	Revision    int64     `json:"revision"`
	LeaseOwner  string    `json:"lease_owner"`
	LeaseExpiry time.Time `json:"lease_expired_at"`
	CreatedAt   time.Time `json:"created_at"`
}

// Uncertain lists the uncertain rows: unrelayed rows of a shard whose lease
// expired while still owned (its relay died or stalled without releasing
// it; a clean stop releases the lease and clears the owner) that were
// created before the lease expired, so the relay that held it may have
// read and published them and lost the ACK or the marker. Their outcome is
// unknown until they are sent again (by the next relay that takes the
// shard, or `posthorn outbox resend`). It returns up to limit rows in id
// order and how many there are.
func (s *OpsStore) Uncertain(ctx context.Context, limit int) ([]UncertainRow, int64, error) {
	var total int64
	if err := s.pool.QueryRow(ctx, `
SELECT count(*) FROM outbox_pending p JOIN outbox o ON o.id = p.id JOIN relay_leases l ON l.shard = p.shard
WHERE l.owner IS NOT NULL AND l.expires_at < now() AND o.created_at < l.expires_at`).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("uncertain rows: %w", err)
	}
	rows, err := s.pool.Query(ctx, `
SELECT o.id, o.event_id::text, o.shard, o.aggregate_id, o.revision, l.owner, l.expires_at, o.created_at
FROM outbox_pending p JOIN outbox o ON o.id = p.id JOIN relay_leases l ON l.shard = p.shard
WHERE l.owner IS NOT NULL AND l.expires_at < now() AND o.created_at < l.expires_at
ORDER BY o.id LIMIT $1`, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("uncertain rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[UncertainRow])
	if err != nil {
		return nil, 0, fmt.Errorf("uncertain rows: %w", err)
	}
	if out == nil {
		out = []UncertainRow{}
	}
	return out, total, nil
}

// ArchiveSegment is one archived segment as recorded in the ledger.
type ArchiveSegment struct {
	Segment      string    `json:"segment"`
	FirstID      int64     `json:"first_id"`
	LastID       int64     `json:"last_id"`
	Rows         int64     `json:"rows"`
	FirstEventID string    `json:"first_event_id,omitempty"`
	LastEventID  string    `json:"last_event_id,omitempty"`
	SHA256       string    `json:"sha256"`
	VerifiedAt   time.Time `json:"verified_at"`
}

// ErrArchiveGap is returned by RecordSegment for a segment that does not
// start right after the recorded archive coverage.
var ErrArchiveGap = errors.New("archive segment does not continue the recorded coverage")

// RecordSegment records a verified segment. It must start at the current
// archive coverage + 1; the check and the insert are one transaction
// under a lock, so two archivers cannot interleave.
func (s *OpsStore) RecordSegment(ctx context.Context, seg ArchiveSegment) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE ops_archive_segments IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("record segment: %w", err)
		}
		var through int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(last_id), 0) FROM ops_archive_segments`).Scan(&through); err != nil {
			return fmt.Errorf("record segment: %w", err)
		}
		if seg.FirstID != through+1 {
			return fmt.Errorf("%w: segment %s starts at id %d, coverage ends at %d", ErrArchiveGap, seg.Segment, seg.FirstID, through)
		}
		var first, last *string
		if seg.FirstEventID != "" {
			first, last = &seg.FirstEventID, &seg.LastEventID
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO ops_archive_segments (segment, first_id, last_id, rows, first_event_id, last_event_id, sha256)
VALUES ($1, $2, $3, $4, $5, $6, $7)`, seg.Segment, seg.FirstID, seg.LastID, seg.Rows, first, last, seg.SHA256); err != nil {
			return fmt.Errorf("record segment: %w", err)
		}
		return nil
	})
}

// ArchiveSegments lists the recorded segments in id order.
func (s *OpsStore) ArchiveSegments(ctx context.Context) ([]ArchiveSegment, error) {
	rows, err := s.pool.Query(ctx, `
SELECT segment, first_id, last_id, rows, coalesce(first_event_id, ''), coalesce(last_event_id, ''), sha256, verified_at
FROM ops_archive_segments ORDER BY first_id`)
	if err != nil {
		return nil, fmt.Errorf("archive segments: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ArchiveSegment])
	if err != nil {
		return nil, fmt.Errorf("archive segments: %w", err)
	}
	return out, nil
}

// ArchiveThrough is the recorded archive coverage: every outbox row with
// id <= the result is in a verified segment (0: none).
func (s *OpsStore) ArchiveThrough(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(last_id), 0) FROM ops_archive_segments`).Scan(&n); err != nil {
		return 0, fmt.Errorf("archive coverage: %w", err)
	}
	return n, nil
}

// FirstUnrelayedID is the smallest id of an unrelayed row (0: none).
func (s *OpsStore) FirstUnrelayedID(ctx context.Context) (int64, error) {
	var id pgtype.Int8
	err := s.pool.QueryRow(ctx, `SELECT min(id) FROM outbox_pending`).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("first unrelayed row: %w", err)
	}
	return id.Int64, nil
}

// CleanupState is what cleanup has done so far.
type CleanupState struct {
	DeletedThroughID int64     `json:"deleted_through_id"`
	JournalFloor     int64     `json:"journal_floor"`
	DeletedRows      int64     `json:"deleted_rows"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// Cleaned returns the cleanup state (zero before the first cleanup).
func (s *OpsStore) Cleaned(ctx context.Context) (CleanupState, error) {
	var c CleanupState
	err := s.pool.QueryRow(ctx, `SELECT deleted_through_id, journal_floor, deleted_rows, updated_at FROM ops_cleanup`).
		Scan(&c.DeletedThroughID, &c.JournalFloor, &c.DeletedRows, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return CleanupState{}, nil
	}
	if err != nil {
		return c, fmt.Errorf("cleanup state: %w", err)
	}
	return c, nil
}

// CleanupPlan is the set of rows a cleanup may delete: rows with
// id <= ThroughID that are relayed, created before Cutoff, and whose
// journal is at or below JournalFloor (or that have none).
type CleanupPlan struct {
	ThroughID    int64     `json:"through_id"`
	Cutoff       time.Time `json:"cutoff"`
	JournalFloor int64     `json:"journal_floor"`
	Rows         int64     `json:"rows"`
	FirstID      int64     `json:"first_id"`
	LastID       int64     `json:"last_id"`
	// InsideWindow counts rows <= ThroughID kept only by the replay window.
	InsideWindow int64 `json:"inside_window"`
}

// PlanCleanup computes the journal floor for rows up to through (the
// highest sequence whose journals have no outbox row above through, capped
// by maxSequence, the lowest cut of the required consumers' coverage) and
// counts the eligible rows.
func (s *OpsStore) PlanCleanup(ctx context.Context, through, maxSequence int64, window time.Duration) (CleanupPlan, error) {
	p := CleanupPlan{ThroughID: through}
	var next pgtype.Int8
	if err := s.pool.QueryRow(ctx, `
SELECT min(j.sequence) FROM outbox o JOIN journals j ON j.id = o.journal_id WHERE o.id > $1`, through).Scan(&next); err != nil {
		return p, fmt.Errorf("plan cleanup: %w", err)
	}
	p.JournalFloor = maxSequence
	if next.Valid && next.Int64-1 < p.JournalFloor {
		p.JournalFloor = next.Int64 - 1
	}
	var first, last pgtype.Int8
	err := s.pool.QueryRow(ctx, `
SELECT now() - $2::interval,
       count(*) FILTER (WHERE o.created_at < now() - $2::interval),
       min(o.id) FILTER (WHERE o.created_at < now() - $2::interval),
       max(o.id) FILTER (WHERE o.created_at < now() - $2::interval),
       count(*) FILTER (WHERE o.created_at >= now() - $2::interval)
FROM outbox o LEFT JOIN journals j ON j.id = o.journal_id
WHERE o.id <= $1 AND `+Relayed+` AND (o.journal_id IS NULL OR j.sequence <= $3)`,
		through, window, p.JournalFloor).Scan(&p.Cutoff, &p.Rows, &first, &last, &p.InsideWindow)
	if err != nil {
		return p, fmt.Errorf("plan cleanup: %w", err)
	}
	p.FirstID, p.LastID = first.Int64, last.Int64
	return p, nil
}

// DeleteBatch deletes up to limit eligible rows of plan with id > after,
// lowest ids first, in one short transaction, and returns how many and the
// highest id deleted. Eligibility is re-checked by the statement itself.
func (s *OpsStore) DeleteBatch(ctx context.Context, plan CleanupPlan, after int64, limit int) (int64, int64, error) {
	var n int64
	var last pgtype.Int8
	err := s.pool.QueryRow(ctx, `
WITH d AS (
    DELETE FROM outbox WHERE id IN (
        SELECT o.id FROM outbox o LEFT JOIN journals j ON j.id = o.journal_id
        WHERE o.id > $1 AND o.id <= $2 AND `+Relayed+` AND o.created_at < $3
          AND (o.journal_id IS NULL OR j.sequence <= $4)
        ORDER BY o.id LIMIT $5)
    RETURNING id)
SELECT count(*), max(id) FROM d`, after, plan.ThroughID, plan.Cutoff, plan.JournalFloor, limit).Scan(&n, &last)
	if err != nil {
		return 0, 0, fmt.Errorf("delete outbox batch: %w", err)
	}
	return n, last.Int64, nil
}

// RecordCleanup advances the cleanup state after deleted rows were removed
// up to through with the plan's floor.
func (s *OpsStore) RecordCleanup(ctx context.Context, through, floor, deleted int64) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO ops_cleanup AS c (deleted_through_id, journal_floor, deleted_rows) VALUES ($1, $2, $3)
ON CONFLICT (singleton) DO UPDATE
   SET deleted_through_id = greatest(c.deleted_through_id, EXCLUDED.deleted_through_id),
       journal_floor = greatest(c.journal_floor, EXCLUDED.journal_floor),
       deleted_rows = c.deleted_rows + EXCLUDED.deleted_rows, updated_at = now()`, through, floor, deleted)
	if err != nil {
		return fmt.Errorf("record cleanup: %w", err)
	}
	return nil
}

// ReplayProgress is a named replay's saved position.
type ReplayProgress struct {
	Name   string
	Spec   []byte
	LastID int64
	Sent   int64
	Done   bool
}

// LoadReplay returns the saved progress of name (found false if none).
func (s *OpsStore) LoadReplay(ctx context.Context, name string) (ReplayProgress, bool, error) {
	p := ReplayProgress{Name: name}
	err := s.pool.QueryRow(ctx, `SELECT spec, last_id, sent, done FROM ops_replay_progress WHERE name = $1`, name).
		Scan(&p.Spec, &p.LastID, &p.Sent, &p.Done)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("replay progress %s: %w", name, err)
	}
	return p, true, nil
}

// SaveReplay writes a named replay's progress.
func (s *OpsStore) SaveReplay(ctx context.Context, p ReplayProgress) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO ops_replay_progress (name, spec, last_id, sent, done) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, last_id = EXCLUDED.last_id, sent = EXCLUDED.sent,
       done = EXCLUDED.done, updated_at = now()`, p.Name, p.Spec, p.LastID, p.Sent, p.Done)
	if err != nil {
		return fmt.Errorf("save replay progress %s: %w", p.Name, err)
	}
	return nil
}

// InboxEventIDs calls fn with the consumer's recorded event IDs in batches
// of up to batch, in event ID order (keyset over the inbox primary key).
func (in *Inbox) InboxEventIDs(ctx context.Context, consumer string, batch int, fn func(ids []string) error) error {
	after := ""
	for {
		rows, err := in.pool.Query(ctx, `
SELECT event_id FROM consumer_inbox WHERE consumer = $1 AND event_id > $2 ORDER BY event_id LIMIT $3`,
			consumer, after, batch)
		if err != nil {
			return fmt.Errorf("inbox event ids: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("inbox event ids: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		if err := fn(ids); err != nil {
			return err
		}
		after = ids[len(ids)-1]
	}
}

// AppliedTwice returns groups of event IDs that the consumer applied for
// the same aggregate revision: one effect per revision was expected.
func (in *Inbox) AppliedTwice(ctx context.Context, consumer string) ([][]string, error) {
	rows, err := in.pool.Query(ctx, `
SELECT array_agg(event_id ORDER BY event_id) FROM consumer_inbox
WHERE consumer = $1 AND disposition = 'applied' AND revision > 0
GROUP BY aggregate_type, aggregate_id, revision HAVING count(*) > 1`, consumer)
	if err != nil {
		return nil, fmt.Errorf("applied twice: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	if err != nil {
		return nil, fmt.Errorf("applied twice: %w", err)
	}
	return out, nil
}
