package horizon_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A build of posthorn a run measures: the old design or the tree under test.
type build struct {
	name string // "old" or "new"
	rev  string // the commit it was built from, for the report
	bin  string
}

// buildNew builds ./cmd/posthorn of the tree under test into dir, as a
// user would (no test-only build tags).
func buildNew(b *testing.B, root, dir string) build {
	bin := filepath.Join(dir, "posthorn-new")
	if err := goBuild(root, bin); err != nil {
		b.Fatal(err)
	}
	rev := strings.TrimSpace(git(b, root, "rev-parse", "--short", "HEAD"))
	if strings.TrimSpace(git(b, root, "status", "--porcelain", "--untracked-files=no")) != "" {
		rev += " with uncommitted changes"
	}
	return build{name: "new", rev: rev, bin: bin}
}

// buildOld builds ./cmd/posthorn as it was at commit rev, with that
// commit's own go.mod, from a git worktree of this repository made in the
// temporary directory for the build and removed once it is done.
func buildOld(b *testing.B, root, rev, dir string) build {
	var r [4]byte
	_, _ = rand.Read(r[:])
	wt := filepath.Join(os.TempDir(), "posthorn-old-"+hex.EncodeToString(r[:]))
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", wt, rev).CombinedOutput(); err != nil {
		b.Fatalf("git worktree add %s %s: %v\n%s(the old design's commit must be in this clone's history; a shallow clone lacks it: git fetch --unshallow, or set POSTHORN_HORIZON_OLD to another commit)", wt, rev, err, out)
	}
	defer func() {
		if out, err := exec.Command("git", "-C", root, "worktree", "remove", "--force", wt).CombinedOutput(); err != nil {
			b.Errorf("git worktree remove %s: %v\n%s", wt, err, out)
		}
	}()
	bin := filepath.Join(dir, "posthorn-old")
	if err := goBuild(wt, bin); err != nil {
		b.Fatal(err)
	}
	return build{name: "old", rev: strings.TrimSpace(git(b, wt, "rev-parse", "--short", "HEAD")), bin: bin}
}

// goBuild runs go build ./cmd/posthorn in the module at dir.
func goBuild(dir, bin string) error {
	cmd := exec.CommandContext(context.Background(), "go", "build", "-o", bin, "./cmd/posthorn")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/posthorn in %s: %v\n%s", dir, err, out)
	}
	return nil
}

func git(b *testing.B, dir string, args ...string) string {
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		b.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// repoRoot is the repository's root, two levels above this package.
func repoRoot(b *testing.B) string {
	dir, err := filepath.Abs("../..")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cmd/posthorn")); err != nil {
		b.Fatalf("repository root not found from the package directory: %v", err)
	}
	return dir
}
