//go:build !unix

package kfakebroker

// lockDir is a no-op where flock is unavailable: the caller must not start
// two brokers on one data directory.
func lockDir(string) (func(), error) { return func() {}, nil }
