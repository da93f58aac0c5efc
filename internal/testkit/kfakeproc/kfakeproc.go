// Package kfakeproc runs a kfakebroker in a process of its own, for tests
// that SIGKILL the broker: a crash must take a real process down, with
// whatever it held in memory, while the test's own process (the producer
// under test) goes on.
//
// The broker process is the test binary itself, started again with
// -test.run naming a helper test that calls ServeIfChild:
//
//	func TestKfakeBrokerProcess(t *testing.T) { kfakeproc.ServeIfChild(t) }
//
//	b := kfakeproc.Start(t, "TestKfakeBrokerProcess")
//	restart := b.Kill() // SIGKILL
//	restart()           // same port, same data directory
//
// The helper test skips in an ordinary run. The child exits when its
// standard input closes, so a test process that dies never leaves a broker
// behind.
package kfakeproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/internal/testkit/servertest"
)

const (
	envListen  = "POSTHORN_KFAKEPROC_LISTEN"
	envDataDir = "POSTHORN_KFAKEPROC_DATA_DIR"
	// Partitions of ledger.events and auto-created topics.
	Partitions = 4
	ready      = "kfakeproc ready"
)

// Broker is a kfake broker process on a fixed port and data directory.
type Broker struct {
	// Addr is the broker's host:port; it stays the same across restarts.
	Addr   string
	t      testing.TB
	helper string
	dir    string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
}

// Start starts the broker process on a free port and a fresh data
// directory and returns once it accepts connections; it is killed at
// cleanup. helperTest is the caller's test that calls ServeIfChild.
func Start(t testing.TB, helperTest string) *Broker {
	t.Helper()
	b := &Broker{Addr: fmt.Sprintf("127.0.0.1:%d", servertest.FreePort(t)), t: t, helper: helperTest, dir: t.TempDir()}
	t.Cleanup(func() { b.Kill() })
	b.StartAgain()
	return b
}

// StartAgain starts the process (after Kill) on the same port and data
// directory and returns once the broker has loaded its data and listens.
func (b *Broker) StartAgain() {
	b.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+b.helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), envListen+"="+b.Addr, envDataDir+"="+filepath.Join(b.dir, "data"))
	stderr, err := os.OpenFile(filepath.Join(b.dir, "broker.err"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.t.Fatalf("kfakeproc: start the broker process: %v", err)
	}
	exited := make(chan struct{})
	up := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), ready) {
				close(up)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(exited)
	}()
	b.cmd, b.stdin, b.exited = cmd, stdin, exited
	select {
	case <-up:
	case <-exited:
		b.t.Fatalf("kfakeproc: the broker process exited while starting (%v): %s", cmd.ProcessState, b.errTail())
	case <-time.After(60 * time.Second):
		b.Kill()
		b.t.Fatalf("kfakeproc: the broker did not start within 60 s: %s", b.errTail())
	}
}

// Kill ends the broker process with SIGKILL and waits for it to be gone;
// it returns StartAgain.
func (b *Broker) Kill() (restart func()) {
	if b.cmd != nil {
		_ = b.cmd.Process.Kill()
		<-b.exited
		_ = b.stdin.Close()
		b.cmd = nil
	}
	return b.StartAgain
}

func (b *Broker) errTail() string {
	s, _ := os.ReadFile(filepath.Join(b.dir, "broker.err"))
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return string(s)
}

// ServeIfChild is the body of the helper test named to Start: in the
// broker process it runs the broker until its standard input closes, then
// exits the process; in any other run it skips.
func ServeIfChild(t *testing.T) {
	listen := os.Getenv(envListen)
	if listen == "" {
		t.Skip("the broker process of kfakeproc.Start; nothing to do in a test run")
	}
	b, err := kfakebroker.Start(kfakebroker.Options{
		Listen:     listen,
		DataDir:    os.Getenv(envDataDir),
		Partitions: Partitions,
		Topics:     []string{core.TopicEvents},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(ready, b.Addrs()[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	b.Close()
	os.Exit(0)
}
