package faultkit

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// TestDumpHelper is not a test: run as a child by TestSummarizeDump
// (FAULTKIT_DUMP_HELPER=1), it parks three goroutines on one channel and
// waits for SIGQUIT.
func TestDumpHelper(t *testing.T) {
	if os.Getenv("FAULTKIT_DUMP_HELPER") != "1" {
		t.Skip("helper process only")
	}
	block := make(chan struct{})
	for range 3 {
		go func() { <-block }()
	}
	// Ready once all three are parked, so the dump shows them waiting.
	buf := make([]byte, 1<<20)
	for strings.Count(string(buf[:runtime.Stack(buf, true)]), "[chan receive]") < 3 {
		runtime.Gosched()
	}
	os.Stdout.WriteString("ready\n")
	select {}
}

// TestSummarizeDump reads the dump a real Go process writes on SIGQUIT:
// the three goroutines parked on one channel are one stack, counted three
// times, with their state.
func TestSummarizeDump(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestDumpHelper$")
	cmd.Env = append(os.Environ(), "FAULTKIT_DUMP_HELPER=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !bufio.NewScanner(out).Scan() {
		t.Fatal("helper did not start")
	}
	if err := cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	sum := SummarizeDump(stderr.String())
	want := "3 goroutine(s) [chan receive]:\ngithub.com/posthorn/posthorn/internal/testkit/faultkit.TestDumpHelper.func1(…)"
	if !strings.Contains(sum, want) {
		t.Fatalf("summary lacks %q:\n%s", want, sum)
	}
	if strings.Contains(sum, "\nruntime.gopark") {
		t.Fatalf("summary keeps the scheduler's frames:\n%s", sum)
	}
	if got := SummarizeDump("no dump here"); got != "no goroutine dump" {
		t.Fatalf("text without a dump: %q", got)
	}
}

func TestLastRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.log")
	log := "==== p start 1 at T1\nfirst\n==== p exited: killed at T2\n==== p start 2 at T3\nsecond\n==== p exited: exit status 2 at T4\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := LastRun(path), "==== p start 2 at T3\nsecond\n==== p exited: exit status 2 at T4\n"; got != want {
		t.Fatalf("LastRun = %q, want %q", got, want)
	}
}
