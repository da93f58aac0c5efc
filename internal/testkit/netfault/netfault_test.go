package netfault_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/netfault"
)

// The tests run the test binary again as a child under a pool user
// (helperMain): a client whose connections a fault selects, or a run that
// is SIGKILLed with its rules in place.
func TestMain(m *testing.M) {
	switch os.Getenv("NETFAULT_HELPER") {
	case "":
		os.Exit(m.Run())
	case "stream":
		stream(os.Getenv("NETFAULT_ADDR"))
	case "hold":
		hold(os.Getenv("NETFAULT_PORT"))
	}
	os.Exit(0)
}

// stream keeps one connection to addr and sends a numbered line every
// 50 ms; it prints "sent N" and "echo N" lines.
func stream(addr string) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	go func() {
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			fmt.Println("echo", sc.Text())
		}
	}()
	for i := 1; ; i++ {
		if _, err := fmt.Fprintf(c, "%d\n", i); err != nil {
			fmt.Println("write:", err)
			os.Exit(1)
		}
		fmt.Println("sent", i)
		time.Sleep(50 * time.Millisecond) // the stream's pace, not a synchronisation
	}
}

// hold opens faults, cuts every process's connections to port, says
// "ready" and waits to be killed.
func hold(port string) {
	n, err := netfault.Open()
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	p, _ := strconv.Atoi(port)
	if _, err := n.Cut(netfault.Both, netfault.Link{To: []int{p}}); err != nil {
		fmt.Println("cut:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}

// echoServer echoes lines on 127.0.0.1 and counts what it received.
type echoServer struct {
	ln       net.Listener
	received atomic.Int64
	lines    sync.Map // every line received
}

func (s *echoServer) saw(line string) bool { _, ok := s.lines.Load(line); return ok }

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					s.received.Add(1)
					s.lines.Store(sc.Text(), true)
					if _, err := fmt.Fprintln(c, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *echoServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// child is a helper process and what it printed.
type child struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	sent   int
	echoes int
	lines  []string
}

// helperBinary is the test binary, copied where a pool user may execute
// it (go test builds it in a directory only root may enter).
func helperBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "netfault.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// startChild runs the helper mode under u (the zero User: as root).
func startChild(t *testing.T, bin, mode string, u netfault.User, env ...string) *child {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), append([]string{"NETFAULT_HELPER=" + mode}, env...)...)
	if u.Name != "" {
		cmd.SysProcAttr = u.SysProcAttr()
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.lines = append(c.lines, line)
			switch {
			case strings.HasPrefix(line, "sent "):
				c.sent++
			case strings.HasPrefix(line, "echo "):
				c.echoes++
			}
			c.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	return c
}

func (c *child) counts() (sent, echoes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent, c.echoes
}

func (c *child) printed(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if l == s {
			return true
		}
	}
	return false
}

// eventually polls cond every 20 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// steady reports whether f's value stays the same for d (polled).
func steady(d time.Duration, f func() int64) bool {
	v := f()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if f() != v {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling over a window
	}
	return true
}

// dialWorks reports whether a plain connection of this (root) process to
// port gets its echo: a fault on a pool user must not touch it.
func dialWorks(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintln(c, "probe"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "probe\n"
}

func setup(t *testing.T) (*netfault.Net, *echoServer) {
	t.Helper()
	if testing.Short() {
		t.Skip("changes this machine's netfilter rules")
	}
	return netfault.New(t), newEchoServer(t)
}

// streams is setup with a pool user claimed: it returns the user and a
// function that starts a stream child to the echo server as that user.
func streams(t *testing.T) (*netfault.Net, *echoServer, netfault.User, func() *child) {
	t.Helper()
	n, srv := setup(t)
	u, err := n.User()
	if err != nil {
		t.Fatal(err)
	}
	bin, addr := helperBinary(t), fmt.Sprintf("NETFAULT_ADDR=127.0.0.1:%d", srv.port())
	return n, srv, u, func() *child { return startChild(t, bin, "stream", u, addr) }
}

// A cut stops the link both ways on an established connection while other
// processes' connections to the same port go on; the heal restores it.
func TestCutBlocksAndHealRestores(t *testing.T) {
	n, srv, u, stream := streams(t)
	c := stream()
	echoes := func() int64 { _, e := c.counts(); return int64(e) }
	eventually(t, 10*time.Second, "the stream flows before the cut", func() bool { return echoes() >= 5 })

	f, err := n.Cut(netfault.Both, netfault.Link{From: u, To: []int{srv.port()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fault: %v", f)
	// Lines in flight when the rule went in may still arrive; then none.
	eventually(t, 5*time.Second, "the server stops receiving", func() bool { return steady(500*time.Millisecond, srv.received.Load) })
	if !steady(time.Second, srv.received.Load) || !steady(200*time.Millisecond, echoes) {
		t.Fatal("the cut link still carries data")
	}
	if !dialWorks(srv.port()) {
		t.Fatal("the cut of a pool user's link stopped this process's own connection to the port")
	}
	before := srv.received.Load()
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the stream flows again after the heal", func() bool { return srv.received.Load() > before+5 })
	e := echoes()
	eventually(t, 15*time.Second, "echoes come back after the heal", func() bool { return echoes() > e+5 })
}

// A one-way cut of the replies lets the requests reach the server and
// loses every response; a cut of the requests keeps the server from
// hearing anything.
func TestOneWayCuts(t *testing.T) {
	n, srv, u, stream := streams(t)
	c := stream()
	echoes := func() int64 { _, e := c.counts(); return int64(e) }
	eventually(t, 10*time.Second, "the stream flows", func() bool { return echoes() >= 5 })
	link := netfault.Link{From: u, To: []int{srv.port()}}

	r := srv.received.Load()
	f, err := n.Cut(netfault.Replies, link)
	if err != nil {
		t.Fatal(err)
	}
	// Lines written after the cut still reach the server (as many as the
	// client's TCP sends before it waits for an ACK that never comes)...
	eventually(t, 5*time.Second, "requests reach the server with the replies cut", func() bool { return srv.received.Load() > r+3 })
	// ...and no echo comes back.
	eventually(t, 5*time.Second, "no echo arrives with the replies cut", func() bool { return steady(500*time.Millisecond, echoes) })
	if got := srv.received.Load(); got <= r+3 {
		t.Fatalf("the server received %d lines after the cut", got-r)
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	e := echoes()
	eventually(t, 15*time.Second, "echoes come back after the heal", func() bool { return echoes() > e+5 })

	f, err = n.Cut(netfault.Requests, link)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the server stops receiving with the requests cut", func() bool { return steady(500*time.Millisecond, srv.received.Load) })
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	r = srv.received.Load()
	eventually(t, 15*time.Second, "requests reach the server after the heal", func() bool { return srv.received.Load() > r+5 })
}

// CutRepliesFrom lets each connection run until it sends the needle: that
// request reaches the server and its answer and all later ones are lost,
// while a connection that has not sent it yet still gets its answers
// (the trip is per connection, by content, not a switch in time); the
// heal brings the lost answers back.
func TestCutRepliesFromANeedleOn(t *testing.T) {
	n, srv, u, stream := streams(t)
	a := stream()
	echoesA := func() int64 { _, e := a.counts(); return int64(e) }
	eventually(t, 10*time.Second, "stream A flows", func() bool { return echoesA() >= 60 })
	b := stream()
	echoesB := func() int64 { _, e := b.counts(); return int64(e) }
	eventually(t, 10*time.Second, "stream B flows", func() bool { return echoesB() >= 5 })

	sentA, _ := a.counts()
	k := sentA + 20
	// Each line goes out in a packet of its own, and no smaller number
	// ends in k's digits, so line k is the first packet carrying "k\n".
	f, err := n.CutRepliesFrom(netfault.Needle(strconv.Itoa(k)+"\n"), netfault.Link{From: u, To: []int{srv.port()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fault: %v", f)
	eventually(t, 10*time.Second, "A's echoes stop once it sent line k", func() bool { return steady(500*time.Millisecond, echoesA) })
	if !a.printed(fmt.Sprintf("echo %d", k-1)) || a.printed(fmt.Sprintf("echo %d", k)) {
		t.Fatalf("A's last echo is not line %d (the one before the needle): %d echoes", k-1, echoesA())
	}
	if sentB, _ := b.counts(); sentB >= k {
		t.Fatalf("B reached line %d before A's cut was seen; the checks of B need it behind", k)
	}
	if !srv.saw(strconv.Itoa(k)) {
		t.Fatalf("line %d, the needle, did not reach the server", k)
	}
	eB := echoesB()
	eventually(t, 5*time.Second, "B, which has not sent the needle, still gets its echoes", func() bool { return echoesB() > eB+5 })
	eventually(t, 15*time.Second, "B's echoes stop once it sent line k", func() bool { return b.printed(fmt.Sprintf("echo %d", k-1)) && steady(500*time.Millisecond, echoesB) })
	if b.printed(fmt.Sprintf("echo %d", k)) {
		t.Fatalf("B got the echo of line %d, the needle", k)
	}
	if !dialWorks(srv.port()) {
		t.Fatal("the fault on a pool user's link stopped this process's own connection to the port")
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	e := echoesA()
	eventually(t, 15*time.Second, "echoes come back after the heal", func() bool { return echoesA() > e+5 && a.printed(fmt.Sprintf("echo %d", k)) })
}

// CutAllRepliesFrom cuts every connection of the link once one of them
// sent the trigger, here picked out by its payload's bytes (the way a
// Kafka request is, by its API key at offset 4): the other connection,
// which never sent it, loses its replies at the same moment.
func TestCutAllRepliesFromATriggerOn(t *testing.T) {
	n, srv, u, stream := streams(t)
	a := stream()
	b := stream()
	echoesA := func() int64 { _, e := a.counts(); return int64(e) }
	echoesB := func() int64 { _, e := b.counts(); return int64(e) }
	eventually(t, 10*time.Second, "both streams flow", func() bool { return echoesA() >= 20 && echoesB() >= 20 })

	// Line k is "kkk\n", four bytes: the whole payload of its packet, at
	// offset 0. Lines of other lengths never fill those four bytes alike.
	sentA, _ := a.counts()
	k := max(sentA+40, 100)
	if k > 999 {
		t.Fatalf("stream A already at line %d: the trigger needs a line of three digits", sentA)
	}
	tr, err := netfault.PayloadAt(0, []byte(strconv.Itoa(k)+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netfault.PayloadAt(0, make([]byte, 5)); err == nil {
		t.Fatal("PayloadAt took 5 bytes; u32 compares at most 4")
	}
	f, err := n.CutAllRepliesFrom(tr, netfault.Link{From: u, To: []int{srv.port()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fault: %v", f)
	eB := echoesB()
	eventually(t, 5*time.Second, "B gets echoes until A sends line k", func() bool { return echoesB() > eB+5 })
	eventually(t, 10*time.Second, "A's echoes stop once it sent line k", func() bool { return steady(500*time.Millisecond, echoesA) })
	if !a.printed(fmt.Sprintf("echo %d", k-1)) || a.printed(fmt.Sprintf("echo %d", k)) {
		t.Fatalf("A's last echo is not line %d (the one before the trigger): %d echoes", k-1, echoesA())
	}
	if !srv.saw(strconv.Itoa(k)) {
		t.Fatalf("line %d, the trigger, did not reach the server", k)
	}
	if !steady(time.Second, echoesB) {
		t.Fatal("B, on the same link, still gets echoes after A sent the trigger")
	}
	if !dialWorks(srv.port()) {
		t.Fatal("the fault on a pool user's link stopped this process's own connection to the port")
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	e, eb := echoesA(), echoesB()
	eventually(t, 15*time.Second, "echoes come back on both after the heal", func() bool {
		return echoesA() > e+5 && echoesB() > eb+5 && a.printed(fmt.Sprintf("echo %d", k))
	})
}

// Degrade delays each packet of the link by its delay (so a round trip by
// twice that) and drops its share, and the link still works.
func TestDegradeDelaysAndDrops(t *testing.T) {
	n, srv, u, stream := streams(t)
	c := stream()
	eventually(t, 10*time.Second, "the stream flows", func() bool { _, e := c.counts(); return e >= 5 })
	f, err := n.Degrade(netfault.Impairment{Delay: 150 * time.Millisecond, Jitter: 50 * time.Millisecond, Loss: 0.05},
		netfault.Link{From: u, To: []int{srv.port()}})
	if err != nil {
		t.Fatal(err)
	}
	// The stream writes a line every 50 ms; with a round trip of at least
	// 300 ms the echoes lag the sends by at least 5 lines.
	eventually(t, 10*time.Second, "the echoes lag the sends by the delay", func() bool {
		s, e := c.counts()
		return s-e >= 5
	})
	// 150 echoes pass some 400 packets through the queue: with 5% loss the
	// chance that none is dropped is below one in a billion (20 echoes,
	// about 70 packets, left it at 3%, and a CI run met it).
	_, e := c.counts()
	eventually(t, 60*time.Second, "echoes keep coming through the delay and the loss", func() bool { _, e2 := c.counts(); return e2 > e+150 })
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	st := f.Stats()
	t.Logf("degraded: %+v", st)
	if st.Delayed == 0 || st.Dropped == 0 {
		t.Fatalf("the queue delayed %d and dropped %d packets; want some of each", st.Delayed, st.Dropped)
	}
	eventually(t, 10*time.Second, "the echoes catch up after the heal", func() bool {
		s, e := c.counts()
		return s-e <= 2
	})
}

// Its control: without Degrade the echoes keep up with the sends, so the
// lag above is the fault's.
func TestDegradeControlNoLag(t *testing.T) {
	_, _, _, stream := streams(t)
	c := stream()
	eventually(t, 10*time.Second, "the stream flows", func() bool { _, e := c.counts(); return e >= 20 })
	for range 20 {
		if s, e := c.counts(); s-e >= 5 {
			t.Fatalf("echoes lag the sends by %d lines without a fault", s-e)
		}
		time.Sleep(50 * time.Millisecond) // sampling the lag
	}
}

// A run SIGKILLed with its rules in place leaves them until Sweep, which
// removes its chains and jumps, and only its own.
func TestSweepRemovesADeadRunsRules(t *testing.T) {
	n, srv := setup(t)
	if _, err := n.Cut(netfault.Both, netfault.Link{To: []int{1}}); err != nil { // this run's own, kept
		t.Fatal(err)
	}
	c := startChild(t, helperBinary(t), "hold", netfault.User{}, fmt.Sprintf("NETFAULT_PORT=%d", srv.port()))
	eventually(t, 20*time.Second, "the child has cut the port", func() bool { return c.printed("ready") })
	if dialWorks(srv.port()) {
		t.Fatal("the child's cut does not hold")
	}
	pid := c.cmd.Process.Pid
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	chain := fmt.Sprintf("PHNF-%d-o", pid)
	if !strings.Contains(iptablesS(t), "-N "+chain) {
		t.Fatalf("the killed run's chain %s is not there before the sweep", chain)
	}
	if dialWorks(srv.port()) {
		t.Fatal("the killed run's cut went away by itself; this test would not show the sweep")
	}
	swept, err := netfault.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("swept %v", swept)
	rules := iptablesS(t)
	if strings.Contains(rules, fmt.Sprintf("PHNF-%d-", pid)) {
		t.Fatalf("the killed run's rules are still there:\n%s", rules)
	}
	if !strings.Contains(rules, fmt.Sprintf("-N PHNF-%d-o", os.Getpid())) {
		t.Fatalf("the sweep removed this live run's chains:\n%s", rules)
	}
	if !dialWorks(srv.port()) {
		t.Fatal("the port is still cut after the sweep")
	}
}

func iptablesS(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("iptables", "-w", "5", "-S").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -S: %v: %s", err, out)
	}
	return string(out)
}

// Close removes every rule and chain of the run.
func TestCloseLeavesNoRule(t *testing.T) {
	if testing.Short() {
		t.Skip("changes this machine's netfilter rules")
	}
	n, err := netfault.Open()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Cut(netfault.Replies, netfault.Link{To: []int{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Degrade(netfault.Impairment{Delay: time.Millisecond}, netfault.Link{To: []int{4}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(iptablesS(t), fmt.Sprintf("PHNF-%d-", os.Getpid())) {
		t.Fatal("no chain while faults are in force")
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if rules := iptablesS(t); strings.Contains(rules, fmt.Sprintf("PHNF-%d-", os.Getpid())) {
		t.Fatalf("rules left after Close:\n%s", rules)
	}
}
