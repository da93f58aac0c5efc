// Package servertest holds what the broker test packages (natstest,
// redistest, amqptest, kfakeproc) share: the shared server's address from
// the environment, a fresh random name or prefix per test, a free port for
// a dedicated server of one test, and the crash of such a server.
package servertest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
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

// Prefix returns a fresh prefix ("t<hex>.") for one test's objects on a
// shared server and, at cleanup, calls drop with it to delete them.
func Prefix(t testing.TB, drop func(prefix string)) string {
	p := Name("t") + "."
	t.Cleanup(func() { drop(p) })
	return p
}

// Kill ends a dedicated server's process with SIGKILL, as a crash would,
// and reaps it; a process never started or already reaped is left alone.
func Kill(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil || cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
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
