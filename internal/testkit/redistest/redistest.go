// Package redistest gives tests a Redis: the shared one on this machine
// (127.0.0.1:6379) with a fresh key prefix per test, removed at cleanup, or
// a dedicated redis-server on a free port in a temp dir with appendonly yes
// and appendfsync always (the durable setup: a reply comes after the AOF
// is fsynced), which a test may kill and start again. The machine's shared
// Redis keeps nothing on disk (--save "" --appendonly no), so a restart of
// it loses every stream by configuration; restart tests use a dedicated one.
package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/posthorn/posthorn/internal/testkit/servertest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// SharedAddr is the machine's Redis unless POSTHORN_TEST_REDIS_ADDR says otherwise.
func SharedAddr() string { return servertest.Getenv("POSTHORN_TEST_REDIS_ADDR", "127.0.0.1:6379") }

// Prefix returns a fresh key prefix ("t<hex>."); the keys under it are
// deleted from addr at cleanup.
func Prefix(t testing.TB, addr string) string {
	return servertest.Prefix(t, func(p string) {
		c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
		defer c.Close()
		ctx := context.Background()
		it := c.Scan(ctx, 0, p+"*", 1000).Iterator()
		for it.Next(ctx) {
			c.Del(ctx, it.Val())
		}
	})
}

// Server is a dedicated redis-server.
type Server struct {
	Addr     string
	t        testing.TB
	port     int
	dir      string
	volatile bool
	cmd      *exec.Cmd
}

// Start starts a dedicated durable server (appendonly yes, appendfsync
// always); it is killed at cleanup.
func Start(t testing.TB) *Server { return start(t, false) }

// StartVolatile starts a dedicated server that keeps nothing on disk, like
// the machine's shared one: the negative control of durability tests.
func StartVolatile(t testing.TB) *Server { return start(t, true) }

func start(t testing.TB, volatile bool) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redistest: redis-server not installed (apt-get install redis-server): %v", err)
	}
	port := servertest.FreePort(t)
	s := &Server{t: t, port: port, dir: t.TempDir(), volatile: volatile, Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	s.StartAgain()
	t.Cleanup(s.Kill)
	return s
}

// StartAgain starts the server on its port and directory (after Kill); it
// loads the AOF written before.
func (s *Server) StartAgain() {
	s.t.Helper()
	aof := []string{"--appendonly", "yes", "--appendfsync", "always"}
	if s.volatile {
		aof = []string{"--appendonly", "no"}
	}
	s.cmd = exec.Command("redis-server", append([]string{"--bind", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"--dir", s.dir, "--save", "", "--logfile", "redis.log", "--daemonize", "no"}, aof...)...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	// A ping also waits out LOADING.
	wait.For(s.t, 10*time.Second, "redis-server on "+s.Addr+" to answer", func() bool { return c.Ping(context.Background()).Err() == nil })
}

// Kill ends the server with SIGKILL, as a crash would.
func (s *Server) Kill() { servertest.Kill(s.cmd) }
