// Package faultkit runs Posthorn as real processes for the fault suite
// (integration/fault_test.go): the posthorn binary built once, the dev
// Kafka-protocol broker, the Posting API, relays and consumer instances as
// child processes that can be killed (SIGKILL), frozen (SIGSTOP/SIGCONT)
// and restarted, plus the faults the suite injects into them and into
// PostgreSQL, the load, and the figures it reports.
//
// Every child writes its stdout and stderr to a log file of its own
// (appended across restarts), whose tail the suite prints when a check
// fails. A supervisor restarts a child that exits on its own and counts it,
// so a crash is a reported figure, not a silent gap in the run.
package faultkit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/netfault"
)

// Build compiles ./cmd/posthorn of the module that contains the working
// directory into dir, with the test-only --unsafe-* flags (build tag
// posthorn_unsafe), and returns the binary's path. The child binary is
// built without the race detector so that a run under `go test -race`
// (the test process only) keeps its pace.
func Build(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(dir, "posthorn")
	// -tags posthorn_unsafe: the negative controls' --unsafe-* flags exist
	// only in this test build, never in the production binary.
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "posthorn_unsafe", "-o", bin, "./cmd/posthorn")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/posthorn: %v\n%s", err, out)
	}
	return bin, nil
}

// Proc is one child process that can be started again after it died.
// Its methods are safe for concurrent use.
type Proc struct {
	Name string
	bin  string
	args []string
	env  []string
	log  string
	// readyLine, when set, is a prefix of a stdout line Start waits for.
	readyLine string
	// ready, when set, is polled by Start until it returns nil.
	ready func(ctx context.Context) error
	// attr, when set, is every run's SysProcAttr (a Unix user of its own).
	attr func() *syscall.SysProcAttr

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when the current run has exited
	expected bool          // the current run was stopped on purpose
	stopped  bool          // SIGSTOPped
	closed   bool
	starts   int
	crashes  int
}

// ProcConfig describes a child process.
type ProcConfig struct {
	Name string
	Bin  string
	Args []string
	// Env is added to the test's environment.
	Env []string
	// LogDir receives <Name>.log.
	LogDir string
	// ReadyLine is a prefix of a stdout line that tells the process is ready.
	ReadyLine string
	// Ready is polled until nil when the process is ready (e.g. an HTTP
	// health check).
	Ready func(ctx context.Context) error
	// User, when its Name is set, is the Unix user the process runs as,
	// so that a partition can cut its links (netfault). Bin must then lie
	// where that user can reach it (ExposeDir).
	User netfault.User
}

// HTTPReady is a ProcConfig.Ready for a process that serves HTTP: ready
// once a GET of url answers 200 OK.
func HTTPReady(url string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}

// NewProc returns a process that is not started yet.
func NewProc(c ProcConfig) *Proc {
	p := &Proc{Name: c.Name, bin: c.Bin, args: c.Args, env: c.Env, log: filepath.Join(c.LogDir, c.Name+".log"),
		readyLine: c.ReadyLine, ready: c.Ready}
	if c.User.Name != "" {
		p.attr = c.User.SysProcAttr
	}
	return p
}

// ExposeDir makes dir and the directories above it, up to the temporary
// directory's root, enterable by every user (0755): a process of a pool
// user execs the binary in it (the exec's path lookup needs the search
// permission that the capabilities it keeps only give it after exec).
func ExposeDir(dir string) error {
	for d := dir; d != "/" && d != "." && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// LogPath is the file the process writes to.
func (p *Proc) LogPath() string { return p.log }

// Start starts the process and waits until it is ready (up to 60 s).
func (p *Proc) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New(p.Name + ": closed")
	}
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			p.mu.Unlock()
			return errors.New(p.Name + ": already running")
		}
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	fmt.Fprintf(f, "==== %s start %d at %s\n", p.Name, p.starts+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	if p.attr != nil {
		cmd.SysProcAttr = p.attr()
	}
	cmd.Stderr = f
	readyc := make(chan struct{})
	var pw *io.PipeWriter
	if p.readyLine != "" {
		var pr *io.PipeReader
		pr, pw = io.Pipe()
		cmd.Stdout = pw
		go func() {
			sc := bufio.NewScanner(pr)
			once := sync.Once{}
			for sc.Scan() {
				line := sc.Text()
				fmt.Fprintln(f, line)
				if strings.HasPrefix(line, p.readyLine) {
					once.Do(func() { close(readyc) })
				}
			}
			_, _ = io.Copy(io.Discard, pr)
		}()
	} else {
		cmd.Stdout = f
		close(readyc)
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		p.mu.Unlock()
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.expected, p.stopped = cmd, done, false, false
	p.starts++
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		if pw != nil {
			pw.Close()
		}
		fmt.Fprintf(f, "==== %s exited: %v at %s\n", p.Name, cmd.ProcessState, time.Now().Format(time.RFC3339Nano))
		f.Close()
		close(done)
	}()

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	select {
	case <-readyc:
	case <-done:
		return fmt.Errorf("%s exited before it was ready; log %s:\n%s", p.Name, p.log, Tail(p.log, 20))
	case <-wctx.Done():
		return fmt.Errorf("%s not ready: %w; log %s:\n%s", p.Name, wctx.Err(), p.log, Tail(p.log, 20))
	}
	if p.ready != nil {
		for {
			if err := p.ready(wctx); err == nil {
				break
			}
			select {
			case <-done:
				return fmt.Errorf("%s exited before it was ready; log:\n%s", p.Name, Tail(p.log, 20))
			case <-wctx.Done():
				return fmt.Errorf("%s not ready: %w; log:\n%s", p.Name, wctx.Err(), Tail(p.log, 20))
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// Signal sends sig to the running process.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return errors.New(p.Name + ": not started")
	}
	switch sig {
	case syscall.SIGKILL, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT:
		p.expected = true
	case syscall.SIGSTOP:
		p.stopped = true
	case syscall.SIGCONT:
		p.stopped = false
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits for the process to exit.
func (p *Proc) Kill() {
	if err := p.Signal(syscall.SIGKILL); err == nil {
		<-p.doneChan()
	}
}

// Quit sends SIGQUIT, on which a Go program writes every goroutine's
// stack to its stderr (the log file) and exits, and waits for the exit.
func (p *Proc) Quit() {
	if err := p.Signal(syscall.SIGQUIT); err == nil {
		<-p.doneChan()
	}
}

// Term stops the process softly (SIGTERM, after SIGCONT if it was frozen)
// and waits up to timeout, then kills it.
func (p *Proc) Term(timeout time.Duration) {
	p.mu.Lock()
	frozen := p.stopped
	p.mu.Unlock()
	if frozen {
		_ = p.Signal(syscall.SIGCONT)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return
	}
	select {
	case <-p.doneChan():
	case <-time.After(timeout):
		p.Kill()
	}
}

// Running reports whether the current run has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.doneChan():
		return false
	default:
		return true
	}
}

// Pid is the process ID of the current run (0 before the first start),
// e.g. for reading its /proc/<pid>/status.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Starts is how many times the process was started.
func (p *Proc) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Crashes is how many runs exited without being signalled by the suite.
func (p *Proc) Crashes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.crashes
}

func (p *Proc) doneChan() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

// Supervise restarts the process whenever it exits without having been
// signalled by the suite, until ctx ends; each such exit is counted as a
// crash. Restarts after a deliberate kill are the caller's.
func (p *Proc) Supervise(ctx context.Context, logf func(string, ...any)) {
	for {
		done := p.doneChan()
		select {
		case <-ctx.Done():
			return
		case <-done:
		}
		p.mu.Lock()
		// A run started since the one watched means the caller restarted
		// it after a deliberate stop: expected is the new run's.
		unexpected := !p.expected && !p.closed && p.done == done
		if unexpected {
			p.crashes++
			p.expected = true // counted once
		}
		p.mu.Unlock()
		if unexpected {
			logf("%s exited on its own; restarting. Log tail:\n%s", p.Name, Tail(p.log, 15))
			for ctx.Err() == nil {
				if err := p.Start(ctx); err == nil {
					break
				} else {
					logf("restart %s: %v", p.Name, err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			continue
		}
		// A deliberate stop: wait for the caller's restart.
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops the process (soft, then hard) and keeps it from starting again.
func (p *Proc) Close() {
	p.mu.Lock()
	p.closed = true
	started := p.cmd != nil
	p.mu.Unlock()
	if started {
		p.Term(10 * time.Second)
	}
}

// Tail returns the last n lines of the file at path.
func Tail(path string, n int) string {
	return lastLines(path, n, func(string) bool { return true })
}

// Errors returns the last n lines of the log at path that a component
// logged at ERROR (a park, a failed marker write): they may lie far above
// its tail.
func Errors(path string, n int) string {
	return lastLines(path, n, func(l string) bool { return strings.Contains(l, `"level":"ERROR"`) })
}

// Matching returns the last n lines of the log at path that hold text.
func Matching(path, text string, n int) string {
	return lastLines(path, n, func(l string) bool { return strings.Contains(l, text) })
}

func lastLines(path string, n int, keep func(string) bool) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if keep(l) {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
