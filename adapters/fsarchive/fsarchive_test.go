package fsarchive_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/posthorn/posthorn/adapters/fsarchive"
)

func TestPutGetReplaceAndMissing(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "archive")
	s, err := fsarchive.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "manifest.json"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing name: %v, want fs.ErrNotExist", err)
	}
	for _, v := range []string{"one", "two"} {
		if err := s.Put(ctx, "manifest.json", []byte(v)); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, "manifest.json")
		if err != nil || string(got) != v {
			t.Fatalf("got %q %v, want %q", got, err, v)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("%d files in the archive, want 1 (no temporary file left)", len(entries))
	}
	for _, bad := range []string{"", "..", "a/b", `a\b`} {
		if err := s.Put(ctx, bad, nil); err == nil {
			t.Errorf("Put(%q) accepted", bad)
		}
	}
}
