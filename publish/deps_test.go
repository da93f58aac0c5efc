package publish_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPublishDependsOnCoreAndPgxAlone: a team adds this package to its own
// service, so everything it pulls in ships there. Its dependencies must be
// core's, pgx's and its own: no migrations tool, no replication library,
// no broker client, no other Posthorn package.
func TestPublishDependsOnCoreAndPgxAlone(t *testing.T) {
	allowed := map[string]bool{"github.com/posthorn/posthorn/publish": true}
	for _, p := range deps(t, "github.com/posthorn/posthorn/core", "github.com/jackc/pgx/v5") {
		allowed[p] = true
	}
	var extra []string
	for _, p := range deps(t, "github.com/posthorn/posthorn/publish") {
		if !allowed[p] {
			extra = append(extra, p)
		}
	}
	if len(extra) > 0 {
		t.Fatalf("publish pulls in %d packages beyond core's and pgx's:\n%s", len(extra), strings.Join(extra, "\n"))
	}
}

func deps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", strings.Join(pkgs, " "), err)
	}
	return strings.Fields(string(out))
}
