package inboxstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
)

// genericPlans are the plans PostgreSQL keeps for each query (with the
// literal EXECUTE arguments next to it), a prepared statement past its first
// executions (a generic plan), on a fresh consumer database holding rows
// inbox rows and 200 positions of consumer c, never analyzed: a new
// consumer's first minute, before autovacuum's first analyze.
func genericPlans(t *testing.T, rows int, queries ...[2]string) []string {
	t.Helper()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	exec := func(q string) {
		t.Helper()
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
		 SELECT 'c', 'e-' || g, 'event', 't', 'account', 'acc-' || (g % 200), g / 200 + 1, 'applied'
		 FROM generate_series(1, ` + strconv.Itoa(rows) + `) g`)
	exec(`INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id)
		 SELECT 'c', 'account', 'acc-' || g FROM generate_series(0, 199) g`)
	exec(`SET plan_cache_mode = force_generic_plan`)
	var plans []string
	for i, q := range queries {
		name := "q" + strconv.Itoa(i)
		exec(`PREPARE ` + name + ` AS ` + q[0])
		rs, err := conn.Query(ctx, `EXPLAIN EXECUTE `+name+`(`+q[1]+`)`)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rs, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plans = append(plans, strings.Join(lines, "\n"))
	}
	exec(`DEALLOCATE ALL`)
	exec(`RESET plan_cache_mode`)
	return plans
}

// The batch's lookups are planned key by key on a table without
// statistics, once it holds a few batches' rows (2,000 here; below that
// PostgreSQL, which then believes a consumer's rows as few as an event's,
// may take an index on the consumer alone until autovacuum's first
// analyze): each event's (or aggregate's) rows are reached through the index
// on its whole key. The negative control is the plain join the applied-event
// lookup was before: on the same tables its generic plan reads every row of
// the consumer for the batch, and a fresh consumer database took 2.6 s per
// 512-event batch at the end of a 200,000-event backlog.
func TestBatchLookupsPlannedByKeyWithoutStatistics(t *testing.T) {
	t.Parallel()
	const (
		lookupArgs = `'c', '{e-x}', '{account}', '{acc-1}', '{1}'`
		lockArgs   = `'c', '{account}', '{acc-1}'`
		joinLookup = `
		SELECT u.event_id, min(i.event_id)
		FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(event_id, aggregate_type, aggregate_id, revision)
		JOIN consumer_inbox i ON i.consumer = $1 AND i.aggregate_type = u.aggregate_type AND i.aggregate_id = u.aggregate_id
		     AND i.revision = u.revision AND i.disposition = 'applied' AND i.event_id <> u.event_id
		GROUP BY u.event_id`
	)
	// keyed: the plan reaches the table through index with a condition on
	// the aggregate ID (the last key column but the revision).
	keyed := func(plan, index string) bool {
		return strings.Contains(plan, "Index Scan using "+index) && strings.Contains(plan, "aggregate_id = u.")
	}
	for _, rows := range []int{3000, 20000} {
		plans := genericPlans(t, rows, [2]string{appliedBeforeSQL, lookupArgs}, [2]string{lockPositionsSQL, lockArgs},
			[2]string{joinLookup, lookupArgs})
		if !keyed(plans[0], "consumer_inbox_revision") {
			t.Errorf("%d rows: the applied-event lookup is not keyed:\n%s", rows, plans[0])
		}
		if !keyed(plans[1], "consumer_positions_pkey") {
			t.Errorf("%d rows: the position lock is not keyed:\n%s", rows, plans[1])
		}
		if keyed(plans[2], "consumer_inbox_revision") {
			t.Errorf("%d rows: the control, the plain join, is keyed too: the test shows nothing\n%s", rows, plans[2])
		}
	}
}

// The applied-twice check from a mark probes each changed revision through
// the index on the aggregate and revision on a table without statistics.
// The negative control is the plain join it was first written as: on the
// same table its generic plan reads every applied row once per changed
// revision (in BenchmarkHistory's empty run, 11.9 s against 0.5 s for the
// pass that read the whole inbox).
func TestAppliedTwiceSinceProbesByRevisionWithoutStatistics(t *testing.T) {
	t.Parallel()
	const join = `
SELECT array_agg(i.event_id ORDER BY i.event_id)
FROM (SELECT DISTINCT aggregate_type, aggregate_id, revision FROM consumer_inbox
      WHERE consumer = $1 AND changed_xid >= $2::text::xid8 AND disposition = 'applied' AND revision > 0) AS k
JOIN consumer_inbox AS i ON i.consumer = $1 AND i.aggregate_type = k.aggregate_type AND i.aggregate_id = k.aggregate_id
                         AND i.revision = k.revision AND i.disposition = 'applied'
GROUP BY k.aggregate_type, k.aggregate_id, k.revision HAVING count(*) > 1`
	plans := genericPlans(t, 20000, [2]string{appliedTwiceSinceSQL, `'c', '3'`}, [2]string{join, `'c', '3'`})
	if !strings.Contains(plans[0], "Index Scan using consumer_inbox_revision on consumer_inbox o") ||
		!strings.Contains(plans[0], "aggregate_id = consumer_inbox.aggregate_id") {
		t.Errorf("applied twice since a mark does not probe by revision:\n%s", plans[0])
	}
	if !strings.Contains(plans[1], "Join Filter") {
		t.Errorf("the control, the plain join, does not filter a scan per revision: the test shows nothing\n%s", plans[1])
	}
}

// The applied-event lookups, of a batch and of one event, are planned key
// by key whatever the inbox's statistics say, as the consumer's own login
// (row-level security on), with the consumer's name as each execution's
// plan sees it: statistics taken while only another consumer had rows (a
// consumer added to a database others fill), and none at all on a large
// table (a fresh database before autovacuum's first analyze, in which the
// example consumers' shared database applies most of a backlog). 50,000
// rows of each consumer; a batch of 512 of audit-log's events, then one.
// The negative control is each lookup as it was, the consumer a constant
// and the disposition an index condition (and, for one event, ORDER BY …
// LIMIT 1): in both cases its plan reaches the rows through an index on the
// consumer (and disposition) and reads every row of the consumer for each
// event (4–6 s a batch in make bench-consumers).
func TestAppliedLookupsKeyedWithStaleOrNoStatistics(t *testing.T) {
	t.Parallel()
	const n = 512
	eventIDs, types, aggIDs, revisions := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	for i := range n {
		eventIDs[i], types[i], aggIDs[i], revisions[i] = "new-"+strconv.Itoa(i), "account", "acc-"+strconv.Itoa(i), 30
	}
	lookups := []struct {
		name, sql, old string
		args           []any
	}{
		{"batch", appliedBeforeSQL, `
		SELECT u.event_id, a.event_id
		FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(event_id, aggregate_type, aggregate_id, revision)
		CROSS JOIN LATERAL (
		    SELECT (array_agg(i.event_id ORDER BY i.event_id))[1] AS event_id FROM consumer_inbox i
		    WHERE i.consumer = $1 AND i.aggregate_type = u.aggregate_type AND i.aggregate_id = u.aggregate_id
		      AND i.revision = u.revision AND i.disposition = 'applied' AND i.event_id <> u.event_id) a
		WHERE a.event_id IS NOT NULL`, []any{"audit-log", eventIDs, types, aggIDs, revisions}},
		{"one event", appliedAtSQL, `
		SELECT event_id FROM consumer_inbox
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND revision = $4
		  AND disposition = 'applied' AND event_id <> ALL($5::text[])
		ORDER BY event_id LIMIT 1`, []any{"audit-log", "account", "acc-1", 30, []string{}}},
	}
	for _, stale := range []bool{true, false} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url, owner := roletest.Consumer(t)
			fill := func(consumer string) {
				t.Helper()
				if _, err := owner.Exec(ctx, `INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
				 SELECT $1, 'e-' || g, 'event', 't', 'account', 'acc-' || (g % 1000), g / 1000 + 1, 'applied'
				 FROM generate_series(1, 50000) g`, consumer); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := owner.Exec(ctx, `ALTER TABLE consumer_inbox SET (autovacuum_enabled = false)`); err != nil {
				t.Fatal(err)
			}
			fill("balance-projection")
			if stale {
				if _, err := owner.Exec(ctx, `ANALYZE consumer_inbox`); err != nil {
					t.Fatal(err)
				}
			}
			fill("audit-log")
			login := roletest.Pool(t, roletest.Consumers(t, url, "", "audit-log"))
			for _, l := range lookups {
				for _, q := range []string{l.sql, l.old} {
					rs, err := login.Query(ctx, `EXPLAIN `+q, l.args...)
					if err != nil {
						t.Fatal(err)
					}
					lines, err := pgx.CollectRows(rs, pgx.RowTo[string])
					if err != nil {
						t.Fatal(err)
					}
					plan := strings.Join(lines, "\n")
					keyed := strings.Contains(plan, "Index Scan using consumer_inbox_revision") && strings.Contains(plan, "(aggregate_id = ")
					if keyed != (q == l.sql) {
						t.Errorf("%s: keyed %v, want %v (control: the lookup as it was):\n%s", l.name, keyed, q == l.sql, plan)
					}
				}
			}
		})
	}
}
