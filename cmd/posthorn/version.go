package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func runVersion(ctx context.Context, args []string) error {
	if err := newFlags("version").Parse(args); err != nil {
		return err
	}
	fmt.Printf("posthorn %s\n", version)
	if bi, ok := debug.ReadBuildInfo(); ok {
		fmt.Printf("go %s\n", bi.GoVersion)
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" || s.Key == "vcs.time" {
				fmt.Printf("%s %s\n", s.Key, s.Value)
			}
		}
	}
	return nil
}
