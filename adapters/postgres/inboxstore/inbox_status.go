package inboxstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/posthorn/posthorn/adapters/postgres/internal/pgrows"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// Dispositions returns the inbox rows of the given event IDs for consumer;
// an event ID without a row is absent from the map (the consumer has not
// seen it).
func (in *Inbox) Dispositions(ctx context.Context, consumer string, eventIDs []string) (map[string]core.InboxRecord, error) {
	recs, err := pgrows.Query(ctx, in.pool, scanInboxRecord, `SELECT `+inboxRecordColumns+`
		FROM consumer_inbox WHERE consumer = $1 AND event_id = ANY($2)`, consumer, eventIDs)
	if err != nil {
		return nil, fmt.Errorf("inbox: dispositions: %w", err)
	}
	return pgrows.ByKey(recs, func(r core.InboxRecord) string { return r.EventID }), nil
}

// Recorded returns what consumer recorded for each of eventIDs, in their
// order: out[i] is eventIDs[i]'s disposition, the zero ops.Disposition
// where the inbox has no row (it holds at most one per event ID).
//
// It is reconciliation's read of every event of a cut, so it spends little
// per row. A long list is read first as one range of the primary key, from
// its smallest to its largest ID, at most twice as many rows as asked for:
// event IDs are time-ordered (UUIDv7), so a batch of consecutive events is
// nearly one contiguous range of the inbox, and reading it costs about an
// eighth of looking each ID up (measured on 1M rows). The IDs the range
// did not yield (not received, or spread wider than the range's limit)
// are then looked up, so the answer does not depend on how the IDs are
// spread. Only the columns reconciliation needs are read, and the driver's
// bytes of the ID and the disposition are matched without being copied.
func (in *Inbox) Recorded(ctx context.Context, consumer string, eventIDs []string) ([]ops.Disposition, error) {
	out := make([]ops.Disposition, len(eventIDs))
	at := make(map[string]int, len(eventIDs))
	repeated := false
	for i, id := range eventIDs {
		if _, ok := at[id]; ok {
			repeated = true
			continue
		}
		at[id] = i
	}
	rest := eventIDs
	if len(eventIDs) >= dispositionsRangeMin {
		err := in.readRecorded(ctx, out, at, `SELECT `+recordedColumns+`
		FROM consumer_inbox WHERE consumer = $1 AND event_id >= $2 AND event_id <= $3
		ORDER BY event_id LIMIT $4`, consumer, slices.Min(eventIDs), slices.Max(eventIDs), 2*len(eventIDs))
		if err != nil {
			return nil, err
		}
		rest = nil
		for id, i := range at {
			if out[i].Disposition == "" {
				rest = append(rest, id)
			}
		}
	}
	if len(rest) > 0 {
		err := in.readRecorded(ctx, out, at, `SELECT `+recordedColumns+`
		FROM consumer_inbox WHERE consumer = $1 AND event_id = ANY($2)`, consumer, rest)
		if err != nil {
			return nil, err
		}
	}
	if repeated {
		for i, id := range eventIDs {
			out[i] = out[at[id]]
		}
	}
	return out, nil
}

// recordedColumns are the columns readRecorded reads.
const recordedColumns = `event_id, disposition, coalesce(reason, ''), duplicates, coalesce(conflicts_with, '')`

// readRecorded runs sql and puts each row it returns at its event ID's
// position (at) in out; rows of IDs not asked for are skipped.
func (in *Inbox) readRecorded(ctx context.Context, out []ops.Disposition, at map[string]int, sql string, args ...any) error {
	rows, err := in.pool.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("inbox: dispositions: %w", err)
	}
	defer rows.Close()
	var id, disp pgtype.DriverBytes
	var d ops.Disposition
	for rows.Next() {
		if err := rows.Scan(&id, &disp, &d.Reason, &d.Duplicates, &d.ConflictsWith); err != nil {
			return fmt.Errorf("inbox: dispositions: %w", err)
		}
		if i, ok := at[string(id)]; ok {
			d.Disposition = dispositionText(disp)
			out[i] = d
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inbox: dispositions: %w", err)
	}
	return nil
}

// dispositionText is b, a disposition as the driver read it, as one of
// core's constants where it is one, so a million rows copy none of them.
func dispositionText(b []byte) string {
	for _, d := range core.Dispositions {
		if string(b) == string(d) {
			return string(d)
		}
	}
	return string(b)
}

// dispositionsRangeMin is the shortest list Recorded reads as a range
// first: below it, looking the IDs up is as cheap.
const dispositionsRangeMin = 64

// List returns up to limit rows of consumer with disposition d, oldest first.
func (in *Inbox) List(ctx context.Context, consumer string, d core.Disposition, limit int) ([]core.InboxRecord, error) {
	recs, err := pgrows.Query(ctx, in.pool, scanInboxRecord, `SELECT `+inboxRecordColumns+`
		FROM consumer_inbox WHERE consumer = $1 AND disposition = $2
		ORDER BY received_at, event_id LIMIT $3`, consumer, string(d), limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	return recs, nil
}

// inboxRecordColumns are the columns scanInboxRecord reads.
const inboxRecordColumns = `event_id, aggregate_type, aggregate_id, revision, disposition, coalesce(reason, ''),
		       coalesce(conflicts_with, ''), duplicates, received_at, updated_at`

func scanInboxRecord(r pgx.CollectableRow) (core.InboxRecord, error) {
	var rec core.InboxRecord
	var d string
	err := r.Scan(&rec.EventID, &rec.AggregateType, &rec.AggregateID, &rec.Revision, &d, &rec.Reason,
		&rec.ConflictsWith, &rec.Duplicates, &rec.ReceivedAt, &rec.UpdatedAt)
	rec.Disposition = core.Disposition(d)
	return rec, err
}

// Counts summarises one consumer's inbox.
type Counts struct {
	// Events is the number of event IDs per disposition.
	Events map[core.Disposition]int64
	// DuplicatesAbsorbed is every repeat the inbox kept from the handler:
	// repeats of known event IDs plus an ordered consumer's events at or
	// below its position with no applied event of their revision to compare
	// IDs with. A revision conflict is not one (Events counts those).
	DuplicatesAbsorbed int64
	// ParkedAggregates is how many aggregates are parked.
	ParkedAggregates int64
}

// Count returns the consumer's Counts.
func (in *Inbox) Count(ctx context.Context, consumer string) (Counts, error) {
	c := Counts{Events: make(map[core.Disposition]int64)}
	rows, err := in.pool.Query(ctx, `
		SELECT disposition, count(*), sum(duplicates) FROM consumer_inbox
		WHERE consumer = $1 GROUP BY disposition`, consumer)
	if err != nil {
		return c, fmt.Errorf("inbox: count: %w", err)
	}
	for rows.Next() {
		var d string
		var n, dup int64
		if err := rows.Scan(&d, &n, &dup); err != nil {
			rows.Close()
			return c, fmt.Errorf("inbox: count: %w", err)
		}
		c.Events[core.Disposition(d)] = n
		c.DuplicatesAbsorbed += dup
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("inbox: count: %w", err)
	}
	if err := in.pool.QueryRow(ctx, `SELECT count(*) FROM consumer_positions WHERE consumer = $1 AND parked`,
		consumer).Scan(&c.ParkedAggregates); err != nil {
		return c, fmt.Errorf("inbox: count: %w", err)
	}
	return c, nil
}

// Parked lists the consumer's parked aggregates with their reasons.
func (in *Inbox) Parked(ctx context.Context, consumer string) ([]consumers.Parked, error) {
	out, err := pgrows.Query(ctx, in.pool, pgx.RowToStructByPos[consumers.Parked], `
		SELECT p.aggregate_type, p.aggregate_id, coalesce(p.parked_reason, ''), p.parked_at,
		       (SELECT count(*) FROM consumer_inbox i
		         WHERE i.consumer = p.consumer AND i.aggregate_type = p.aggregate_type
		           AND i.aggregate_id = p.aggregate_id AND i.disposition IN ('parked_gap', 'parked_poison'))
		FROM consumer_positions p WHERE p.consumer = $1 AND p.parked
		ORDER BY p.parked_at, p.aggregate_id`, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: parked: %w", err)
	}
	return out, nil
}

// LastRevision is the last applied revision of an ordered consumer's
// aggregate (0 if none).
func (in *Inbox) LastRevision(ctx context.Context, consumer, aggregateType, aggregateID string) (int64, error) {
	var last int64
	err := in.pool.QueryRow(ctx, `SELECT last_revision FROM consumer_positions
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
		consumer, aggregateType, aggregateID).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return last, err
}

// Waiting returns how many of consumer's events are held and how many of
// its aggregates are parked: cheap (partial indexes), for gauges.
func (in *Inbox) Waiting(ctx context.Context, consumer string) (held, parkedAggregates int64, err error) {
	err = in.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND disposition = 'held'),
		       (SELECT count(*) FROM consumer_positions WHERE consumer = $1 AND parked)`,
		consumer).Scan(&held, &parkedAggregates)
	if err != nil {
		return 0, 0, fmt.Errorf("inbox: waiting: %w", err)
	}
	return held, parkedAggregates, nil
}

// InboxEventIDs calls fn with the consumer's recorded event IDs in batches
// of up to batch, in event ID order (keyset over the inbox primary key).
func (in *Inbox) InboxEventIDs(ctx context.Context, consumer string, batch int, fn func(ids []string) error) error {
	after := ""
	for {
		ids, err := pgrows.Query(ctx, in.pool, pgx.RowTo[string], `
SELECT event_id FROM consumer_inbox WHERE consumer = $1 AND event_id > $2 ORDER BY event_id LIMIT $3`,
			consumer, after, batch)
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

// RevisionConflicts returns every row of consumer recorded as
// revision_conflict, with the event ID applied at its revision, oldest
// first (the disposition index makes it a short scan).
func (in *Inbox) RevisionConflicts(ctx context.Context, consumer string) ([]ops.RevisionConflict, error) {
	out, err := pgrows.Query(ctx, in.pool, pgx.RowToStructByPos[ops.RevisionConflict], `
SELECT event_id, coalesce(conflicts_with, ''), aggregate_type, aggregate_id, revision FROM consumer_inbox
WHERE consumer = $1 AND disposition = 'revision_conflict' ORDER BY received_at, event_id`, consumer)
	if err != nil {
		return nil, fmt.Errorf("revision conflicts: %w", err)
	}
	return out, nil
}

// AppliedTwice returns groups of event IDs that the consumer applied for
// the same aggregate revision: one effect per revision was expected.
//
// It asks first whether any two applied rows may share a revision: it
// counts the distinct 64-bit hashes of (aggregate type, aggregate ID,
// revision) against the rows. Equal keys hash equal, so as many hashes as
// rows proves no revision applied twice, which is the answer nearly every
// time; a million rows take about 0.3 s of one core. The grouping that
// names the groups, a sort of every applied row with its event ID (1.2 s
// and three processes per million), runs only when the hashes say it may
// find one. It compares the revision first and the text in the "C"
// collation: equal under any deterministic collation means equal bytes, so
// the groups are the same, and a byte comparison is cheaper than the
// database's locale's.
func (in *Inbox) AppliedTwice(ctx context.Context, consumer string) ([][]string, error) {
	var maybe bool
	err := in.pool.QueryRow(ctx, `
SELECT count(*) > count(DISTINCT hashtextextended(aggregate_id, revision) # hashtextextended(aggregate_type, 0))
FROM consumer_inbox WHERE consumer = $1 AND disposition = 'applied' AND revision > 0`, consumer).Scan(&maybe)
	if err != nil {
		return nil, fmt.Errorf("applied twice: %w", err)
	}
	if !maybe {
		return nil, nil
	}
	out, err := pgrows.Query(ctx, in.pool, pgx.RowTo[[]string], `
SELECT array_agg(event_id ORDER BY event_id) FROM consumer_inbox
WHERE consumer = $1 AND disposition = 'applied' AND revision > 0
GROUP BY revision, aggregate_id COLLATE "C", aggregate_type COLLATE "C" HAVING count(*) > 1`, consumer)
	if err != nil {
		return nil, fmt.Errorf("applied twice: %w", err)
	}
	return out, nil
}
