package configs_test

// Tests of the operators' kit: the Prometheus alert rules, their promtool
// unit tests, the runbook they link to and the Grafana dashboard. They hold
// the kit to the contract's metric names, so a renamed metric or a typo in
// a panel fails here rather than as an empty graph in production.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/posthorn/posthorn/configs"
)

const (
	alertsFile     = "prometheus/posthorn-alerts.yml"
	alertTestsFile = "prometheus/posthorn-alerts_test.yml"
	runbookFile    = "prometheus/RUNBOOK.md"
	dashboardFile  = "grafana/posthorn-dashboard.json"
	// contractDoc is the repository's own copy of the outside contract.
	contractDoc = "../docs/contract.md"
)

// contractMetrics is the metrics table of contract.md, written out here so
// that a change to configs.ContractMetrics is a deliberate, reviewed one.
var contractMetrics = []string{
	"posthorn_outbox_backlog_events",
	"posthorn_outbox_oldest_unrelayed_age_seconds",
	"posthorn_relay_published_total",
	"posthorn_relay_publish_seconds",
	"posthorn_relay_lease_takeovers_total",
	"posthorn_relay_parked_aggregates",
	"posthorn_relay_held_by_open_transaction_seconds",
	"posthorn_relay_open_transaction_age_seconds",
	"posthorn_wal_slot_retained_bytes",
	"posthorn_consumer_messages_total",
	"posthorn_consumer_revision_gaps_total",
}

func TestContractMetricsMatchTheContract(t *testing.T) {
	if !slices.Equal(sorted(configs.ContractMetrics), sorted(contractMetrics)) {
		t.Errorf("configs.ContractMetrics = %v\nwant the contract's %v", configs.ContractMetrics, contractMetrics)
	}
	for _, h := range configs.ContractHistograms {
		if !slices.Contains(contractMetrics, h) {
			t.Errorf("histogram %s is not a contract metric", h)
		}
	}
	doc, err := os.ReadFile(contractDoc)
	if err != nil {
		t.Fatalf("the contract must be in the repository: %v", err)
	}
	// Rows of the metrics table, in its section only (other tables name SQL
	// functions and roles that start with posthorn_ too):
	// | `posthorn_…` | kind | labels |
	_, section, ok := strings.Cut(string(doc), "\n## Metrics\n")
	if !ok {
		t.Fatalf("%s has no \"## Metrics\" section", contractDoc)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var inDoc []string
	for _, m := range regexp.MustCompile("(?m)^\\|\\s*`(posthorn_[a-z0-9_]+)`").FindAllStringSubmatch(section, -1) {
		inDoc = append(inDoc, m[1])
	}
	if !slices.Equal(sorted(inDoc), sorted(contractMetrics)) {
		t.Errorf("contract.md lists %v\nthis test lists %v: update both lists and configs/metricnames.go", sorted(inDoc), sorted(contractMetrics))
	}
}

// --- PromQL metric-name extraction -----------------------------------------

var (
	// Grafana's variables ($__rate_interval, ${datasource}, $consumer).
	grafanaVar = regexp.MustCompile(`\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*`)
	stringLit  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	matchers   = regexp.MustCompile(`\{[^}]*\}`)
	ranges     = regexp.MustCompile(`\[[^\]]*\]`)
	grouping   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// A number (with exponent or duration suffix) or an identifier.
	token       = regexp.MustCompile(`(?i:0x[0-9a-f]+|(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?(?:ms|s|m|h|d|w|y)*)|[A-Za-z_:][A-Za-z0-9_:]*`)
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(?:([A-Za-z_:][A-Za-z0-9_:]*(?:\{[^}]*\})?)\s*,)?\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
)

var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "bool": true, "and": true, "or": true, "unless": true,
	"offset": true, "atan2": true, "inf": true, "nan": true, "start": true, "end": true,
}

// metricNames returns the metric names a PromQL expression (possibly with
// Grafana variables) selects. It is a lexer, not a parser: it removes what
// cannot be a metric name (strings, label matchers, ranges, grouping label
// lists, numbers, keywords) and keeps the identifiers that are not called
// as functions or aggregations.
func metricNames(expr string) []string {
	if m := labelValues.FindStringSubmatch(expr); m != nil {
		if m[1] == "" {
			return nil
		}
		expr = m[1]
	}
	s := grafanaVar.ReplaceAllString(expr, "")
	s = stringLit.ReplaceAllString(s, `""`)
	s = matchers.ReplaceAllString(s, "{}")
	s = ranges.ReplaceAllString(s, "[]")
	s = grouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range token.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		if c := tok[0]; c >= '0' && c <= '9' || c == '.' || promqlKeywords[strings.ToLower(tok)] {
			continue
		}
		if strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") {
			continue // a function or an aggregation
		}
		if !slices.Contains(names, tok) {
			names = append(names, tok)
		}
	}
	return names
}

// unknownMetrics returns the names in expr that are not contract metrics
// (histograms may be selected by their _bucket, _sum and _count series).
func unknownMetrics(expr string) []string {
	var bad []string
	for _, n := range metricNames(expr) {
		if !isContractSeries(n) {
			bad = append(bad, n)
		}
	}
	return bad
}

func isContractSeries(name string) bool {
	if slices.Contains(configs.ContractMetrics, name) || slices.Contains(configs.OperatorMetrics, name) {
		return true
	}
	for _, h := range configs.ContractHistograms {
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if name == h+suf {
				return true
			}
		}
	}
	return false
}

func TestMetricNamesExtraction(t *testing.T) {
	for expr, want := range map[string][]string{
		`max(posthorn_outbox_oldest_unrelayed_age_seconds)`: {"posthorn_outbox_oldest_unrelayed_age_seconds"},
		`histogram_quantile(0.99, sum by (le, sink) (rate(posthorn_relay_publish_seconds_bucket{sink=~"$sink"}[$__rate_interval]))) > 2`: {"posthorn_relay_publish_seconds_bucket"},
		`sum(rate(a_total{x="rate(b_total)"}[5m] offset 1h)) / on (job) group_left (c) b_info * 1e9 > bool 2.5`:                          {"a_total", "b_info"},
		`(sum(rate(x_total[5m])) or vector(0)) == 0 and sum(delta(y[10m])) > 0`:                                                          {"x_total", "y"},
		`sum without (instance) (up)`:                              {"up"},
		`label_values(posthorn_consumer_messages_total, consumer)`: {"posthorn_consumer_messages_total"},
		`label_values(consumer)`:                                   nil,
		`{__name__="posthorn_relay_published_total"}`:              nil, // a bare matcher names no metric by identifier
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// The checker must catch what it is for: a panel querying a name the relay
// and consumers do not expose.
func TestUnknownMetricIsDetected(t *testing.T) {
	for _, expr := range []string{
		`sum(rate(posthorn_relay_publishd_total[5m]))`,                             // a typo
		`up{job="posthorn"} == 0`,                                                  // a real metric, but not ours
		`max(posthorn_outbox_backlog_events) / posthorn_outbox_backlog`,            // one good, one bad
		`histogram_quantile(0.9, rate(posthorn_relay_published_total_bucket[5m]))`, // not a histogram
	} {
		if len(unknownMetrics(expr)) == 0 {
			t.Errorf("unknownMetrics(%q) found nothing", expr)
		}
	}
	d := dashboard{Panels: []panel{{Title: "typo", Targets: []target{{Expr: "sum(posthorn_consumer_mesages_total)"}}}}}
	if bad := d.unknownMetrics(); len(bad) != 1 || !strings.Contains(bad[0], "posthorn_consumer_mesages_total") {
		t.Errorf("dashboard with an unknown metric: %v", bad)
	}
}

// --- Grafana dashboard -----------------------------------------------------

type target struct {
	Expr string `json:"expr"`
}

type panel struct {
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row holds its panels
}

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// exprs returns every query of the dashboard as "where: expr".
func (d dashboard) exprs() map[string]string {
	out := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				out[p.Title+" #"+string(rune('A'+i))] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if json.Unmarshal(v.Query, &q) != nil {
			var obj struct {
				Query string `json:"query"`
			}
			_ = json.Unmarshal(v.Query, &obj)
			q = obj.Query
		}
		out["variable $"+v.Name] = q
	}
	return out
}

func (d dashboard) unknownMetrics() []string {
	var bad []string
	for where, e := range d.exprs() {
		if u := unknownMetrics(e); len(u) > 0 {
			bad = append(bad, where+": "+strings.Join(u, ", "))
		}
	}
	sort.Strings(bad)
	return bad
}

func TestDashboardUsesOnlyContractMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s does not parse: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard needs a title and a uid (provisioning keys on the uid)")
	}
	exprs := d.exprs()
	if len(exprs) < 10 {
		t.Fatalf("only %d queries found in the dashboard: is the JSON shape what this test expects?", len(exprs))
	}
	for where, e := range exprs {
		if strings.TrimSpace(e) == "" {
			t.Errorf("%s: empty query", where)
		}
	}
	for _, b := range d.unknownMetrics() {
		t.Errorf("dashboard queries a metric outside the contract: %s", b)
	}
	// Every contract metric has a panel: the dashboard is the operator's
	// view of all of them.
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
		}
	}
	for _, m := range append(slices.Clone(configs.ContractMetrics), configs.OperatorMetrics...) {
		if !used[m] {
			t.Errorf("no dashboard panel shows %s", m)
		}
	}
}

// --- Prometheus alert rules ------------------------------------------------

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name          string `yaml:"name"`
		AlertRuleTest []struct {
			Alertname string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestAlertRulesAreCoveredAndLinked(t *testing.T) {
	var rules ruleFile
	readYAML(t, alertsFile, &rules)
	var tests ruleTests
	readYAML(t, alertTestsFile, &tests)
	runbook, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)\s*$`).FindAllStringSubmatch(string(runbook), -1) {
		anchors[strings.ToLower(m[1])] = true
	}

	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	var n int
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if bad := unknownMetrics(r.Expr); len(bad) > 0 {
				t.Errorf("%s uses metrics outside the contract: %v", r.Alert, bad)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
			}
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[k] == "" {
					t.Errorf("%s: no %s annotation", r.Alert, k)
				}
			}
			if u := r.Annotations["runbook_url"]; u != "" {
				_, anchor, _ := strings.Cut(u, "#")
				if !anchors[anchor] {
					t.Errorf("%s: runbook_url anchor %q has no section in %s", r.Alert, anchor, runbookFile)
				}
			}
			if !fires[r.Alert] {
				t.Errorf("%s: no promtool test where it fires", r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("%s: no promtool test where it stays silent", r.Alert)
			}
		}
	}
	if n < 8 {
		t.Errorf("only %d alerts in %s", n, alertsFile)
	}
}

// promtool is the authority on the rules' syntax and behaviour. Debian's
// prometheus package ships it: apt-get install -y prometheus.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("\n**************************************************************\n" +
			"SKIPPED: promtool is not on PATH, so the alert rules were NOT\n" +
			"checked or unit-tested. Install it: apt-get install -y prometheus\n" +
			"**************************************************************")
	}
	for _, args := range [][]string{
		{"check", "rules", filepath.Base(alertsFile)},
		{"test", "rules", filepath.Base(alertTestsFile)},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Dir(alertsFile) // the test file names the rules relative to itself
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func sorted(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

// The operator metrics the alerts rely on are registered by the code under
// exactly these names (a rename would silence an alert).
func TestOperatorMetricsAreRegisteredByTheCode(t *testing.T) {
	var src strings.Builder
	for _, dir := range []string{"../consumers", "../relay"} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			src.Write(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range configs.OperatorMetrics {
		// A collector is named in its options (Name: "…") or as the first
		// argument of a promset.Set method (s.Gauge("…", …)).
		if !strings.Contains(src.String(), `Name:        "`+m+`"`) && !strings.Contains(src.String(), `Name: "`+m+`"`) &&
			!strings.Contains(src.String(), `("`+m+`",`) {
			t.Errorf("no collector in consumers/ or relay/ is named %s", m)
		}
	}
}
