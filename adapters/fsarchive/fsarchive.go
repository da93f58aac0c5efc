// Package fsarchive is the filesystem adapter of ops.ArchiveStore: one
// directory holding the segment files and the manifest.
//
// Durability: Put writes to a temporary file in the same directory, fsyncs
// it, renames it over the name and fsyncs the directory, so a reader sees
// either the old content or the new one, never a torn file, and the new
// content survives a crash once Put has returned.
package fsarchive

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/posthorn/posthorn/ops"
)

// Store is an archive directory.
type Store struct {
	dir string
}

var _ ops.ArchiveStore = (*Store)(nil)

// Open returns the store in dir, creating the directory if needed.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("fsarchive: directory is required")
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("fsarchive: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir is the archive directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return "", fmt.Errorf("fsarchive: bad name %q", name)
	}
	return filepath.Join(s.dir, name), nil
}

// Put implements ops.ArchiveStore.
func (s *Store) Put(ctx context.Context, name string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := s.path(name)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(s.dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("fsarchive: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename this finds nothing
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("fsarchive: write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsarchive: fsync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("fsarchive: close %s: %w", name, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("fsarchive: %w", err)
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("fsarchive: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsarchive: fsync directory: %w", err)
	}
	return nil
}

// Get implements ops.ArchiveStore; a missing name wraps fs.ErrNotExist.
func (s *Store) Get(ctx context.Context, name string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.path(name)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("fsarchive: %w", err)
	}
	return data, nil
}
