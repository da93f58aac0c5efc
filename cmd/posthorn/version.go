package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func init() {
	register(command{name: "version", summary: "print version and build info", run: runVersion})
}

func runVersion(ctx context.Context, args []string) error {
	fs, _ := flagSet("version")
	if err := fs.Parse(args); err != nil {
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
