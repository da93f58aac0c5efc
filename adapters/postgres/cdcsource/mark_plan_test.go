package cdcsource_test

import (
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// The CDC relay's marker probes the queue entry by entry whatever the
// statistics say, as the polling relay's does (relaystore's plan test):
// planned while the queue looked nearly empty, a plain join of the ids
// with the queue scans the whole queue per id, and under a long snapshot
// the queue keeps every deleted entry. Control: the plain join, as the
// marker was written.
func TestCDCMarkerPlanProbesTheQueueWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	plainJoin := `
WITH held AS (
    SELECT token FROM relay_cdc_leases WHERE slot = $3 AND token = $4 FOR SHARE
), del AS (
    DELETE FROM outbox_pending p USING unnest($1::bigint[], $2::int[]) AS m(id, shard)
    WHERE p.shard = m.shard AND p.id = m.id AND EXISTS (SELECT 1 FROM held)
    RETURNING p.id
)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM del)`
	for _, c := range []struct {
		name, query, settings string
		wantProbe             bool
	}{
		{"marker", cdcsource.MarkRelayedForTest, cdcsource.MarkSettingsForTest, true},
		{"control: plain join", plainJoin, `SELECT 1`, false},
	} {
		_, pool := pgtest.Ledger(t)
		plan := pgtest.PlanWhileNearlyEmpty(t, pool, `PREPARE planned(bigint[], int[], text, bigint) AS `+c.query, c.settings,
			`EXPLAIN (FORMAT JSON, COSTS OFF) EXECUTE planned(ARRAY[1,2,3], ARRAY[1,2,3], 'posthorn', 1)`)
		probe := strings.Contains(plan, `"Index Name":"outbox_pending_pkey"`) && strings.Contains(plan, `id = m.id`)
		t.Logf("%s: probes the queue by id = %v", c.name, probe)
		if probe != c.wantProbe {
			t.Errorf("%s: probes the queue by id = %v, want %v; plan: %s", c.name, probe, c.wantProbe, plan)
		}
	}
}
