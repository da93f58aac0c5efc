package faultkit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// A deliberate kill followed at once by the caller's restart is no crash:
// the supervisor, woken by the killed run's exit, finds a new run in its
// place and leaves it alone (it used to count a crash and try to start
// the running process again every second). Control: a run that dies by
// itself is counted and restarted.
func TestSuperviseLeavesADeliberateRestartAlone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var logs []string
	logf := func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(f, a...))
	}
	p := NewProc(ProcConfig{Name: "sleeper", Bin: "/bin/sleep", Args: []string{"600"}, LogDir: t.TempDir()})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); p.Kill() })
	go p.Supervise(ctx, logf)

	const restarts = 30
	s := &System{}
	for range restarts {
		if err := s.KillAndRestart(ctx, p, 0); err != nil {
			t.Fatal(err)
		}
	}
	if wait.Until(time.Second, func() (bool, string) { return p.Crashes() > 0, "" }) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d deliberate restarts counted as %d crashes; supervisor said:\n%s", restarts, p.Crashes(), strings.Join(logs, "\n"))
	}
	if got := p.Starts(); got != restarts+1 {
		t.Fatalf("started %d times, want %d", got, restarts+1)
	}

	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the supervisor counts and restarts a run that died by itself",
		func() bool { return p.Crashes() == 1 && p.Starts() == restarts+2 })
}
