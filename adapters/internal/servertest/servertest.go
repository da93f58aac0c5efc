// Package servertest holds what the broker test packages (natstest,
// redistest, amqptest, kfakeproc) share: the shared server's address from
// the environment, a fresh random name per test, and a free port for a
// dedicated server of one test.
package servertest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"
)

// Getenv is the environment variable key, or def when it is unset or
// empty: the machine's shared server unless the environment names another.
func Getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Name returns prefix followed by 12 random hex digits, so that tests on a
// shared server never see each other's objects.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// FreePort returns a TCP port on 127.0.0.1 that was free when asked (the
// dedicated server started next binds it).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
