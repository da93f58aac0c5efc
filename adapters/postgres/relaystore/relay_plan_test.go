package relaystore_test

import (
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// The relay's read must probe the outbox row by row even with a plan made
// while the tables looked empty: the server keeps such a generic plan for
// the prepared statement, and autovacuum may not analyze a fast-growing
// outbox for a minute. A plan that read the whole outbox per read cost the
// relay seconds per read at the start of a busy run (BufFileRead waits of a
// Materialize node in pg_stat_activity). The read's OFFSET 0 fence leaves
// the planner no join to choose, and its settings price a full scan out.
// The control writes the same read as a plain join with sorts off only
// (as it first ran): planned on a near-empty outbox, it scans all of it.
// (With the read's own settings and the range from the shard's low-water
// mark, a plain join is planned as a probe too: the fence is a second
// line of defence.)
func TestRelayReadPlanProbesTheOutboxWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	joined := strings.Replace(relaystore.ReadByIDForTest,
		"CROSS JOIN LATERAL (SELECT * FROM outbox o WHERE o.id = p.id OFFSET 0) o", "JOIN outbox o ON o.id = p.id", 1)
	if joined == relaystore.ReadByIDForTest {
		t.Fatal("the control's rewrite did not apply")
	}
	for _, c := range []struct {
		name, query, settings string
		wantProbe             bool
	}{
		{"relay read", relaystore.ReadByIDForTest, relaystore.ReadSettingsForTest, true},
		{"control: plain join, sorts off only", joined,
			`SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)`, false},
	} {
		_, pool := pgtest.Ledger(t)
		plan := pgtest.PlanWhileNearlyEmpty(t, pool, `PREPARE planned(int[], int, bigint[], bigint[]) AS `+c.query, c.settings,
			`EXPLAIN (FORMAT JSON, COSTS OFF) EXECUTE planned(ARRAY[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15], 313, '{}', ARRAY[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0])`)
		probe := strings.Contains(plan, `"Index Name":"outbox_pkey"`) && strings.Contains(plan, `"Index Cond":"(id = p.id)"`)
		if probe != c.wantProbe {
			t.Errorf("%s: probes the outbox by id = %v, want %v; plan: %s", c.name, probe, c.wantProbe, plan)
		}
	}
}

// The relay's marker must probe the queue entry by entry whatever the
// statistics say: planned while the queue looked nearly empty (the relay
// keeps up, and a long snapshot keeps the deleted entries from VACUUM, not
// from the statistics), a plain join of the ids with the queue was planned
// as a scan of the queue's whole index with every id compared to every
// entry. The control is that plain join, as the marker was written.
func TestMarkerPlanProbesTheQueueWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	const plainJoin = `
WITH held AS (
    SELECT l.shard FROM relay_leases l
    JOIN unnest($2::int[], $3::bigint[]) AS h(shard, token) ON l.shard = h.shard AND l.token = h.token
    FOR SHARE OF l
)
DELETE FROM outbox_pending p
USING unnest($1::bigint[], $4::int[]) AS m(id, shard)
WHERE p.shard = m.shard AND p.id = m.id AND p.shard IN (SELECT shard FROM held)`
	for _, c := range []struct {
		name, query, settings string
		wantProbe             bool
	}{
		{"marker", relaystore.MarkRelayedForTest, relaystore.ReadSettingsForTest, true},
		{"control: plain join", plainJoin, `SELECT 1`, false},
	} {
		_, pool := pgtest.Ledger(t)
		plan := pgtest.PlanWhileNearlyEmpty(t, pool, `PREPARE planned(bigint[], int[], bigint[], int[]) AS `+c.query, c.settings,
			`EXPLAIN (FORMAT JSON, COSTS OFF) EXECUTE planned(ARRAY[1,2,3], ARRAY[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15], ARRAY[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], ARRAY[1,2,3])`)
		probe := strings.Contains(plan, `"Index Name":"outbox_pending_pkey"`) && strings.Contains(plan, `id = m.id`)
		t.Logf("%s: probes the queue by id = %v", c.name, probe)
		if probe != c.wantProbe {
			t.Errorf("%s: probes the queue by id = %v, want %v; plan: %s", c.name, probe, c.wantProbe, plan)
		}
	}
}
