//go:build !posthorn_unsafe

package main

import "github.com/spf13/pflag"

// unsafeFlags says whether the --unsafe-* negative-control flags exist in
// this binary: not in a production build. The fault suite builds with
// -tags posthorn_unsafe (unsafe_on.go) to switch a protection off and show
// that the same fault then loses or duplicates events.
const unsafeFlags = false

// unsafeFlag registers nothing in a production build: the flag is unknown
// (the command refuses it) and absent from --help. The value stays false.
func unsafeFlag(_ *pflag.FlagSet, _, _ string) *bool { return new(bool) }
