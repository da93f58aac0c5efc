package integration

import (
	"context"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// opsKitFiles are the operators' kit files whose queries name metrics.
var opsKitFiles = []string{"../configs/grafana/posthorn-dashboard.json", "../configs/prometheus/posthorn-alerts.yml"}

var posthornMetric = regexp.MustCompile(`\bposthorn_[a-z0-9_]+`)

// referencedMetrics returns every posthorn_* identifier in the kit's files
// that names a metric series (the rules' and panels' queries; alert names
// and the like are CamelCase, so they do not match).
func referencedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, f := range opsKitFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range posthornMetric.FindAllString(string(b), -1) {
			out[m] = append(out[m], f)
		}
	}
	return out
}

// exposedSeries returns the series names on the /metrics page at addr.
func exposedSeries(t *testing.T, addr string) map[string]bool {
	t.Helper()
	_, body := promtest.Get(t, "http://"+addr+"/metrics")
	out := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		out[name] = true
	}
	return out
}

// TestOpsKitMetricsAreExposedByRunningComponents: every metric series the
// Grafana dashboard and the alert rules query is on the /metrics page of a
// running posthorn relay (polling, and CDC for the slot's series) or
// posthorn consume, right after start and a little traffic — the binary as
// users run it, each under its own database role (the CDC relay as a
// posthorn_relay_cdc LOGIN with REPLICATION, the publication created by
// the owner in advance, as the README says). Control: a name the kit does
// not expose is reported (the check is not vacuous).
func TestOpsKitMetricsAreExposedByRunningComponents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := posthornBin(t)
	logDir := t.TempDir()

	// Polling relay and consumers over kfake.
	ledgerURL, ledgerOwner := roletest.Ledger(t)
	consumerURL, consumerOwner := roletest.Consumer(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, core.TopicEvents), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	kafkaEnv := []string{"POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=" + strings.Join(cluster.ListenAddrs(), ",")}
	relayAddr, consAddr, cdcAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	// The polling relay runs exactly once, for the open transaction's
	// series.
	relay := faultkit.NewProc(faultkit.ProcConfig{Name: "relay", Bin: bin, Args: []string{"relay"}, LogDir: logDir,
		Env: append([]string{"POSTHORN_DATABASE__URL=" + roletest.Login(t, ledgerURL, postgres.RoleRelay, ""),
			"POSTHORN_METRICS__LISTEN=" + relayAddr, "POSTHORN_SINK__KAFKA__EXACTLY_ONCE=true"}, kafkaEnv...),
		Ready: faultkit.HTTPReady("http://" + relayAddr + "/readyz")})
	consume := faultkit.NewProc(faultkit.ProcConfig{Name: "consume", Bin: bin, Args: []string{"consume"}, LogDir: logDir,
		Env: append([]string{"POSTHORN_CONSUMER__DATABASE__URL=" + roletest.Consumers(t, consumerURL, "", projection.Name, auditlog.Name),
			"POSTHORN_METRICS__LISTEN=" + consAddr}, kafkaEnv...),
		Ready: faultkit.HTTPReady("http://" + consAddr + "/readyz")})

	// The CDC relay on a throwaway cluster with wal_level=logical.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pc := pgtest.LogicalCluster(t, pgcluster.Options{})
	_, cdcOwnerURL := pgtest.LedgerIn(t, pc, 2)
	admin, err := pgx.Connect(cctx, pc.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.ApplyRoles(cctx, cdcOwnerURL, postgres.LedgerSchema); err != nil {
		t.Fatal(err)
	}
	if err := postgres.CreateLogin(cctx, admin, "cdc_relay", "", postgres.RoleRelayCDC); err != nil {
		t.Fatal(err)
	}
	// REPLICATION is a role attribute: membership cannot pass it on.
	if _, err := admin.Exec(cctx, "ALTER ROLE cdc_relay REPLICATION"); err != nil {
		t.Fatal(err)
	}
	admin.Close(cctx)
	cdcPool := pgtest.Pool(t, cdcOwnerURL, 2)
	if err := cdcsource.New(cdcPool).EnsurePublication(cctx, "posthorn_outbox"); err != nil {
		t.Fatal(err)
	}
	cdcURL, _ := url.Parse(cdcOwnerURL)
	cdcURL.User = url.User("cdc_relay")
	cdc := faultkit.NewProc(faultkit.ProcConfig{Name: "relay-cdc", Bin: bin, Args: []string{"relay"}, LogDir: logDir,
		Env: []string{"POSTHORN_RELAY__MODE=cdc", "POSTHORN_SINK__KIND=memory", "POSTHORN_DATABASE__URL=" + cdcURL.String(),
			"POSTHORN_METRICS__LISTEN=" + cdcAddr},
		Ready: faultkit.HTTPReady("http://" + cdcAddr + "/readyz")})

	for _, p := range []*faultkit.Proc{relay, consume, cdc} {
		t.Cleanup(p.Close)
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	relaytest.MustPost(t, ledgerOwner, "acc-a", "acc-b")
	relaytest.MustPost(t, cdcPool, "acc-a", "acc-b")
	wait.For(t, 60*time.Second, "both relays relayed and the consumers applied", func() bool {
		var n int
		if err := consumerOwner.QueryRow(ctx, `SELECT count(*) FROM consumer_inbox WHERE disposition = 'applied'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 4 && relaytest.Unrelayed(t, cdcPool) == 0
	})

	// A snapshot held open on the ledger, for the horizon's holder.
	snapshot, err := ledgerOwner.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer snapshot.Rollback(ctx) //nolint:errcheck
	if _, err := snapshot.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the relay to name the snapshot as the horizon's holder", func() bool {
		return exposedSeries(t, relayAddr)["posthorn_ledger_horizon_holder"]
	})
	exposed := map[string]bool{}
	for _, addr := range []string{relayAddr, consAddr, cdcAddr} {
		for n := range exposedSeries(t, addr) {
			exposed[n] = true
		}
	}
	refs := referencedMetrics(t)
	if len(refs) < 8 {
		t.Fatalf("only %d metric names found in the kit: %v", len(refs), refs)
	}
	var missing []string
	for name, files := range refs {
		if !exposed[name] {
			missing = append(missing, name+" (in "+strings.Join(files, ", ")+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the kit queries series no running component exposes:\n%s", strings.Join(missing, "\n"))
	}
	// Control: a misspelt name would be caught.
	if exposed["posthorn_relay_publishd_total"] || !exposed["posthorn_relay_published_total"] {
		t.Fatal("control: the exposure check cannot tell a known name from a misspelt one")
	}
	for _, p := range []*faultkit.Proc{relay, consume, cdc} {
		if b, _ := os.ReadFile(p.LogPath()); strings.Contains(string(b), "MORE PRIVILEGES THAN") {
			t.Errorf("%s under its role warns about privileges:\n%s", p.Name, b)
		}
	}
	t.Logf("%d series names of the dashboard and alerts, all exposed", len(refs))
}
