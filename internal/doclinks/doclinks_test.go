package doclinks_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/internal/doclinks"
)

// Every relative link and #anchor in README.md and docs/*.md resolves.
func TestDocsPointSomewhere(t *testing.T) {
	const root = "../.."
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, rel)
	}
	problems, err := doclinks.Check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if len(files) < 10 {
		t.Fatalf("control: only %d documents found under %s: the check reads nothing", len(files), root)
	}
}

// The negative control: a missing file, a missing anchor in another file
// and in the same file are each reported; links to another site, the
// anchors GitHub makes of punctuation, code and repeated headings, and
// links inside code are not.
func TestBrokenLinksAreReported(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("b.md", "# Standbys: never publish what a failover would lose (`relay.standby_flush`)\n\n## Notes\n\n## Notes\n\n<a id=\"kept\"></a>\n")
	write("a.md", strings.Join([]string{
		"# Top",
		"[ok](b.md#standbys-never-publish-what-a-failover-would-lose-relaystandby_flush)",
		"[second notes](b.md#notes-1) [explicit](b.md#kept) [self](#top) [site](https://example.com/x#y)",
		"[gone](missing.md)",
		"[renamed](b.md#standbys)",
		"",
		"see [here](#nowhere)",
		"",
		"```",
		"[in code](nothing.md)",
		"```",
	}, "\n"))
	problems, err := doclinks.Check(dir, []string{"a.md"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.Link)
	}
	want := []string{"missing.md", "b.md#standbys", "#nowhere"}
	if !slices.Equal(got, want) {
		t.Fatalf("reported %q, want %q (%v)", got, want, problems)
	}
	if problems[2].Line != 7 {
		t.Errorf("#nowhere reported on line %d, want 7", problems[2].Line)
	}
}
