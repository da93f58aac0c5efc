package core_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/posthorn/posthorn/"

// businessPackages hold Posthorn's logic; they declare the ports they call
// and never import an adapter (docs/architecture.md).
var businessPackages = []string{"core", "api", "relay", "relay/polling", "relay/cdc", "bridge", "bridge/cdc",
	"ops", "consumers", "consumers/auditlog", "consumers/projection", "console"}

// forbidden reports the dependencies of deps that a business package must
// not have: an adapter, or the libraries only adapters and cmd use.
func forbidden(deps []string) []string {
	var bad []string
	for _, d := range deps {
		switch {
		case strings.HasPrefix(d, module+"adapters/"), d == module+"configs",
			strings.HasPrefix(d, "github.com/pressly/goose"), strings.HasPrefix(d, "github.com/jackc/pglogrepl"),
			d == "github.com/jackc/pgx/v5/pgxpool", strings.HasPrefix(d, "github.com/ThreeDotsLabs/watermill-sql"),
			strings.HasPrefix(d, "github.com/knadh/koanf"):
			bad = append(bad, d)
		}
	}
	return bad
}

// deps lists the transitive dependencies of each package, by package.
func deps(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	args := []string{"list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`}
	for _, p := range pkgs {
		args = append(args, module+p)
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		m[strings.TrimPrefix(f[0], module)] = f[1:]
	}
	return m
}

// No business package imports an adapter, configs (koanf stays at the
// edge), goose, pglogrepl, watermill-sql or pgx pool construction, directly
// or through another package. Control: the binary, which wires adapters
// in, is flagged by the same check, so the check can fail.
func TestBusinessPackagesImportNoAdapter(t *testing.T) {
	t.Parallel()
	all := deps(t, append(businessPackages, "cmd/posthorn")...)
	for _, p := range businessPackages {
		if bad := forbidden(all[p]); len(bad) > 0 {
			t.Errorf("%s depends on %v", p, bad)
		}
	}
	if bad := forbidden(all["cmd/posthorn"]); len(bad) == 0 {
		t.Fatal("control: cmd/posthorn shows no adapter among its dependencies: the check is broken")
	}
}

// koanf stays at the edge: of all the module's packages only configs and
// the binary that maps it depend on configs or koanf. Control: the binary
// is found, so the check can fail.
func TestOnlyTheBinaryReadsConfiguration(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var readers []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, d := range f[1:] {
			if d == module+"configs" || strings.HasPrefix(d, "github.com/knadh/koanf") {
				readers = append(readers, strings.TrimPrefix(f[0], module))
				break
			}
		}
	}
	if !slices.Contains(readers, "cmd/posthorn") {
		t.Fatalf("control: cmd/posthorn is not among the packages that depend on configs (%v): the check is broken", readers)
	}
	for _, p := range readers {
		if p != "cmd/posthorn" && p != "configs" {
			t.Errorf("%s depends on configs or koanf; only cmd/posthorn maps the configuration", p)
		}
	}
}

// The relay's two modes stand side by side over package relay, neither
// importing the other, and relay itself (the vocabulary both use) imports
// neither mode nor its own internals. Control: the polling relay is found
// to import relay, so the check can fail.
func TestRelayModesAreSiblings(t *testing.T) {
	t.Parallel()
	all := deps(t, "relay", "relay/polling", "relay/cdc")
	has := func(p, dep string) bool { return slices.Contains(all[p], module+dep) }
	if !has("relay/polling", "relay") {
		t.Fatalf("control: relay/polling shows no relay among its dependencies (%v): the check is broken", all["relay/polling"])
	}
	for p, dep := range map[string]string{"relay/polling": "relay/cdc", "relay/cdc": "relay/polling"} {
		if has(p, dep) {
			t.Errorf("%s depends on %s: the modes must be siblings", p, dep)
		}
	}
	for _, d := range all["relay"] {
		if strings.HasPrefix(d, module+"relay/") {
			t.Errorf("relay depends on %s: the shared vocabulary must not depend on a mode or an internal package", d)
		}
	}
}

// Test support (internal/testkit) is no room of the product: no package
// outside it but the tests' own (integration, examples' tests) depends on
// it, so the binary, the business packages and the adapters hold only what
// production runs. Control: internal/testkit/exampletest, which builds on
// faultkit, is found to depend on testkit, so the check can fail.
func TestProductImportsNoTestkit(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var control bool
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p := strings.TrimPrefix(f[0], module)
		for _, d := range f[1:] {
			if !strings.HasPrefix(d, module+"internal/testkit/") {
				continue
			}
			switch {
			case p == "internal/testkit/exampletest":
				control = true
			case strings.HasPrefix(p, "internal/testkit/"), p == "integration", strings.HasPrefix(p, "integration/"):
			default:
				t.Errorf("%s depends on %s: test support must stay out of the product", p, d)
			}
		}
	}
	if !control {
		t.Fatal("control: internal/testkit/exampletest shows no testkit dependency: the check is broken")
	}
}

// TestPostgresBaseImportsOnlyCore: the PostgreSQL adapter's base (pool,
// migrations, roles, the history watch) is what every store builds on, so
// it must not reach into a business package or one of the stores.
func TestPostgresBaseImportsOnlyCore(t *testing.T) {
	t.Parallel()
	const base = "adapters/postgres"
	all := deps(t, base, base+"/ledgerstore")
	posthorn := func(p string) []string {
		var out []string
		for _, d := range all[p] {
			if strings.HasPrefix(d, module) && !strings.HasPrefix(d, module+base+"/internal/") {
				out = append(out, strings.TrimPrefix(d, module))
			}
		}
		return out
	}
	if got := posthorn(base); !slices.Equal(got, []string{"core"}) {
		t.Errorf("%s depends on %v, want core alone", base, got)
	}
	if got := posthorn(base + "/ledgerstore"); !slices.Contains(got, "api") {
		t.Fatalf("control: %s/ledgerstore shows no api among its dependencies (%v): the check is broken", base, got)
	}
}
