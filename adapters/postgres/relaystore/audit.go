package relaystore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/relay"
)

// The read's marks are checked against the ledger, in the background and
// at most once per auditEvery: no committed row of an unparked aggregate
// may lie below a mark (lowwater.go says why none can). A row found there
// would stay unread for good and hold its aggregate back without a word,
// so the audit drops every mark at once (the reads start again at each
// shard's first entry and read the row), and the next read returns
// relay.ErrRowsBelowMarks, which the relays log at ERROR and count. The audit
// reads the release generation and the history in the snapshot it reads
// the queue in, and judges only marks made under what it saw: a release
// or a failover since then is no finding. Under a long snapshot its scan
// below the marks walks the queue's dead entries, which is why it runs
// beside the reads, not in them.

// auditEvery is how often a store's reads have their marks audited, and
// auditTimeout the longest an audit may take.
const (
	auditEvery   = time.Minute
	auditTimeout = 30 * time.Second
)

// belowMarksSQL is the audit's query: per shard in $1 with its mark in $2,
// the first pending row of an unparked aggregate below the mark, probed
// as readByID probes.
const belowMarksSQL = `
SELECT s.shard, s.low, b.id
FROM unnest($1::int[], $2::bigint[]) AS s(shard, low)
CROSS JOIN LATERAL (
    SELECT p.id FROM outbox_pending p
    CROSS JOIN LATERAL (SELECT o.aggregate_type, o.aggregate_id FROM outbox o WHERE o.id = p.id OFFSET 0) o
    WHERE p.shard = ANY (ARRAY[s.shard]) AND p.id < s.low
      AND (o.aggregate_type, o.aggregate_id) NOT IN (SELECT aggregate_type, aggregate_id FROM relay_parked)
    ORDER BY p.shard, p.id
    LIMIT 1) b
WHERE s.low > 0`

// readGeneration reads the release generation and the server's history.
const readGeneration = `SELECT (SELECT generation FROM relay_release), h.system_identifier, h.timeline
FROM posthorn.ledger_history() AS h`

// audit schedules and reports the audits of one lowWater.
type audit struct {
	mu      sync.Mutex
	every   time.Duration
	last    time.Time
	running bool
	// found is what the last audit found, until a read reports it.
	found string
}

// due reports whether an audit should start now, and marks it started.
func (a *audit) due(now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running || now.Sub(a.last) < a.every {
		return false
	}
	a.running, a.last = true, now
	return true
}

// finish records the end of an audit and what it found ("" for nothing).
func (a *audit) finish(found string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.running = false
	if found != "" {
		a.found = found
	}
}

// report returns, once, the error for what an audit found.
func (a *audit) report() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.found == "" {
		return nil
	}
	err := fmt.Errorf("%w: %s; every mark was dropped, the shards are read from their first entry", relay.ErrRowsBelowMarks, a.found)
	a.found = ""
	return err
}

// auditMarks starts an audit of the read's marks of shards in the
// background when one is due; ctx ends it.
func (s *Store) auditMarks(ctx context.Context, shards []int) {
	if s.low == nil || !s.audit.due(time.Now()) {
		return
	}
	go func() {
		// Not the read's context: a read's may end with the read.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditTimeout)
		defer cancel()
		found, err := s.belowMarks(ctx, shards)
		if err != nil {
			found = "" // the next audit tries again
		}
		s.audit.finish(found)
	}()
}

// belowMarks runs the audit once and, on a finding, drops the marks and
// says what it found ("" for nothing).
func (s *Store) belowMarks(ctx context.Context, shards []int) (string, error) {
	lows, gen := s.low.marks(shards)
	var found []string
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, readSettings); err != nil {
			return err
		}
		var saw generation
		if err := tx.QueryRow(ctx, readGeneration).Scan(&saw.release, &saw.history.system, &saw.history.timeline); err != nil {
			return err
		}
		if s.low.seen(horizon{release: saw.release, history: saw.history}) != gen.withoutDrops() {
			return nil // marks of another generation: the reads drop them
		}
		rows, err := tx.Query(ctx, belowMarksSQL, toInt32(shards), lows)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				shard   int32
				low, id int64
			)
			if err := rows.Scan(&shard, &low, &id); err != nil {
				return err
			}
			found = append(found, fmt.Sprintf("shard %d: row %d below mark %d", shard, id, low))
		}
		return rows.Err()
	})
	if err != nil || len(found) == 0 {
		return "", err
	}
	s.low.drop()
	return strings.Join(found, ", "), nil
}
