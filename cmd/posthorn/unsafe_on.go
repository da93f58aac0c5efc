//go:build posthorn_unsafe

package main

import "github.com/spf13/pflag"

// unsafeFlags: this binary was built with -tags posthorn_unsafe for the
// fault suite's negative controls.
const unsafeFlags = true

// unsafeFlag registers a hidden negative-control flag (tests only).
func unsafeFlag(fs *pflag.FlagSet, name, usage string) *bool {
	b := fs.Bool(name, false, usage)
	_ = fs.MarkHidden(name)
	return b
}
