// Package childtest runs a child process for a test that watches it: the
// child's exit is awaited in the background from the start, so the test
// can notice an early exit while it waits for something else, and Term
// stops it the way an operator does (SIGTERM), which must end it with
// status 0.
package childtest

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child is a started process whose exit is being awaited.
type Child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // cmd.Wait's, once done is closed
}

// Start starts cmd; at cleanup it is killed if it still runs.
func Start(t testing.TB, cmd *exec.Cmd) *Child {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// Exited is closed once the child has exited; Err then says how.
func (c *Child) Exited() <-chan struct{} { return c.done }

// Err is cmd.Wait's error; call it only once Exited is closed.
func (c *Child) Err() error { return c.err }

// Term sends SIGTERM and fails t unless the child then exits with status 0
// within timeout. log is what the child wrote (its stderr), shown with a
// failure.
func (c *Child) Term(t testing.TB, timeout time.Duration, log fmt.Stringer) {
	t.Helper()
	name := strings.Join(append([]string{filepath.Base(c.cmd.Path)}, c.cmd.Args[1:]...), " ")
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
		if c.err != nil {
			t.Fatalf("%s after SIGTERM: %v, want exit 0\n%s", name, c.err, log)
		}
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s of SIGTERM\n%s", name, timeout, log)
	}
}
