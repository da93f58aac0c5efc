// Package natstest gives tests a NATS server: the shared one on this
// machine (127.0.0.1:4222, JetStream on) with a fresh subject namespace per
// test, or a dedicated nats-server process on a free port with its own
// JetStream store that a test may kill and start again (a broker crash and
// restart) without touching anyone else's server.
package natstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/posthorn/posthorn/internal/testkit/servertest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// SharedURL is the machine's NATS server unless POSTHORN_TEST_NATS_URL says otherwise.
func SharedURL() string { return servertest.Getenv("POSTHORN_TEST_NATS_URL", "nats://127.0.0.1:4222") }

// Prefix returns a fresh subject prefix ("t<hex>.") so tests on a shared
// server never see each other's streams; the streams under it are deleted
// from the server at url at cleanup.
func Prefix(t testing.TB, url string) string {
	return servertest.Prefix(t, func(p string) {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err != nil {
			return // a dedicated server already gone
		}
		defer nc.Close()
		js, err := nc.JetStream()
		if err != nil {
			return
		}
		for name := range js.StreamNames() {
			if strings.HasPrefix(name, strings.TrimSuffix(p, ".")+"_") {
				_ = js.DeleteStream(name)
			}
		}
	})
}

// Server is a dedicated nats-server with JetStream.
type Server struct {
	URL  string
	t    testing.TB
	bin  string
	port int
	dir  string
	cmd  *exec.Cmd
}

// Start starts a dedicated server; it is killed at cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr != nil {
			t.Fatalf("natstest: nats-server not installed (apt-get install nats-server): %v", err)
		}
		bin = "/usr/sbin/nats-server"
	}
	port := servertest.FreePort(t)
	s := &Server{t: t, bin: bin, port: port, dir: t.TempDir(), URL: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	s.StartAgain()
	t.Cleanup(s.Kill)
	return s
}

// StartAgain starts the server on its port and store directory (after Kill).
func (s *Server) StartAgain() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("natstest: start nats-server: %v", err)
	}
	wait.For(s.t, 10*time.Second, fmt.Sprintf("nats-server to open port %d", s.port), func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.port), 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
}

// Kill ends the server with SIGKILL, as a crash would: what JetStream
// stored (written to the OS, not necessarily fsynced) is found again by
// StartAgain.
func (s *Server) Kill() { servertest.Kill(s.cmd) }
