package netfault

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// LockDir holds the runs' and the users' lock files.
const LockDir = "/run/posthorn-netfault"

// UserPrefix starts the names of the pool users scripts/setup-machine
// creates (posthorn-net00 to posthorn-net15).
const UserPrefix = "posthorn-net"

// chainPrefix starts the names of every run's chains: PHNF-<pid>-o and
// PHNF-<pid>-i.
const chainPrefix = "PHNF-"

// Net is one process's faults. Its methods are safe for concurrent use.
type Net struct {
	pid     int
	out, in string
	lock    *os.File

	mu     sync.Mutex
	closed bool
	seq    uint32
	faults map[uint32]*Fault
	users  []*claimed
}

// Dir is the direction of a link a Cut drops.
type Dir int

// Directions: the client is the process of Link.From, the server the one
// listening on Link.To.
const (
	// Both drops every packet of the link's connections.
	Both Dir = iota
	// Requests drops the client's packets only (the server hears nothing).
	Requests
	// Replies drops the server's packets only: requests arrive, responses
	// and TCP ACKs are lost.
	Replies
)

func (d Dir) String() string {
	return [...]string{"both ways", "requests only", "replies only"}[d]
}

// Link is the TCP connections that processes of From open to the ports To
// on 127.0.0.0/8. A zero From is every process's.
type Link struct {
	From User
	To   []int
}

func (l Link) String() string {
	from := "any process"
	if l.From.Name != "" {
		from = l.From.Name
	}
	ports := make([]string, len(l.To))
	for i, p := range l.To {
		ports[i] = strconv.Itoa(p)
	}
	return from + " -> " + strings.Join(ports, ",")
}

// Impairment is what Degrade does to a link's packets, in both directions.
type Impairment struct {
	// Delay and Jitter: each packet is held for Delay plus a uniform
	// random share of Jitter, but never released before an earlier packet
	// of its flow (a flow keeps its order, as on a real path).
	Delay, Jitter time.Duration
	// Loss is the share of packets dropped, 0 to 1.
	Loss float64
}

// Fault is one fault in force until Heal.
type Fault struct {
	n      *Net
	id     uint32
	what   string
	rules  []rule
	queue  *queue // Degrade's
	stats  QueueStats
	healed bool
}

func (f *Fault) String() string { return f.what }

// rule is one iptables rule of a fault: its chain and its match and target.
type rule struct {
	chain string
	spec  []string
}

// New opens the faults of t (Open) and closes them at t's cleanup. It
// fails t when the machine cannot make faults (not root, no iptables):
// scripts/setup-machine makes it ready.
func New(t testing.TB) *Net {
	t.Helper()
	n, err := Open()
	if err != nil {
		t.Fatalf("netfault: %v (scripts/setup-machine installs iptables and the pool users; the faults need root)", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("netfault: %v", err)
		}
	})
	return n
}

// Open sweeps the rules of dead runs and creates this process's chains.
// The caller must Close it.
func Open() (*Net, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("faults on the network need root")
	}
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		return nil, err
	}
	pid := os.Getpid()
	lock, err := lockFile(runLock(pid), true)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", runLock(pid), err)
	}
	if _, err := Sweep(); err != nil {
		lock.Close()
		return nil, err
	}
	n := &Net{pid: pid, out: chainName(pid, "o"), in: chainName(pid, "i"), lock: lock, faults: map[uint32]*Fault{}}
	if err := n.install(); err != nil {
		_ = n.uninstall()
		lock.Close()
		return nil, err
	}
	return n, nil
}

func chainName(pid int, dir string) string { return fmt.Sprintf("%s%d-%s", chainPrefix, pid, dir) }

func runLock(pid int) string { return filepath.Join(LockDir, strconv.Itoa(pid)+".lock") }

// jumps are the rules that lead loopback traffic into the run's chains.
func (n *Net) jumps() []rule {
	return []rule{
		{"OUTPUT", []string{"-o", "lo", "-d", "127.0.0.0/8", "-j", n.out}},
		{"INPUT", []string{"-i", "lo", "-d", "127.0.0.0/8", "-j", n.in}},
	}
}

func (n *Net) install() error {
	for _, c := range []string{n.out, n.in} {
		if err := iptables("-N", c); err != nil {
			return err
		}
	}
	for _, j := range n.jumps() {
		if err := iptables(append([]string{"-I", j.chain, "1"}, j.spec...)...); err != nil {
			return err
		}
	}
	return nil
}

// uninstall removes the run's jumps and chains, whatever of them exists.
func (n *Net) uninstall() error { return removeChains(n.out, n.in) }

// Close heals every fault, removes the chains, stops the queue and frees
// the users. It is safe to call twice.
func (n *Net) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	users, faults := n.users, slices.Collect(maps.Values(n.faults))
	n.users = nil
	n.mu.Unlock()
	err := n.uninstall()
	for _, f := range faults {
		if f.queue != nil {
			_, qerr := f.queue.close()
			err = errors.Join(err, qerr)
		}
	}
	for _, u := range users {
		u.lock.Close()
	}
	_ = os.Remove(runLock(n.pid))
	n.lock.Close()
	return err
}

// Cut drops the links' packets in dir until Heal.
func (n *Net) Cut(dir Dir, links ...Link) (*Fault, error) {
	return n.add(fmt.Sprintf("cut %s: %v", dir, links), links, func(mark string) [][]string {
		match := []string{"-m", "connmark", "--mark", mark}
		switch dir {
		case Requests:
			match = append(match, "-m", "conntrack", "--ctdir", "ORIGINAL")
		case Replies:
			match = append(match, "-m", "conntrack", "--ctdir", "REPLY")
		}
		return [][]string{append(match, "-j", "DROP")}
	}, nil, nil)
}

// A Trigger picks out one request of a link by its bytes: the one a
// CutRepliesFrom or CutAllRepliesFrom fault starts at.
type Trigger struct {
	what  string
	match []string // iptables match options
}

func (tr Trigger) String() string { return tr.what }

// Needle is a request whose packet carries s anywhere.
func Needle(s string) Trigger {
	return Trigger{what: fmt.Sprintf("%q", s), match: []string{"-m", "string", "--algo", "bm", "--string", s}}
}

// PayloadAt is a request whose packet's TCP payload holds b (1 to 4 bytes)
// at offset, wherever the IP and TCP headers end: iptables' u32 match
// follows both header lengths. A packet too short to hold offset+4 bytes
// never matches.
func PayloadAt(offset int, b []byte) (Trigger, error) {
	if offset < 0 || len(b) == 0 || len(b) > 4 {
		return Trigger{}, fmt.Errorf("netfault: PayloadAt needs 1 to 4 bytes at a non-negative offset, not %d at %d", len(b), offset)
	}
	var v uint32
	for _, c := range b {
		v = v<<8 | uint32(c)
	}
	test := fmt.Sprintf("0>>22&0x3C@12>>26&0x3C@%d>>%d=0x%x", offset, 8*(4-len(b)), v)
	return Trigger{what: fmt.Sprintf("payload % x at %d", b, offset), match: []string{"-m", "u32", "--u32", test}}, nil
}

// KafkaRequest is a Kafka request of API key (26 is EndTxn, a
// transaction's commit or abort): the key follows the frame's 4-byte size.
// A request written behind another in one segment is not seen; the next
// one of the key is.
func KafkaRequest(key int16) Trigger {
	tr, _ := PayloadAt(4, []byte{byte(uint16(key) >> 8), byte(key)})
	tr.what = fmt.Sprintf("Kafka request of API key %d", key)
	return tr
}

// CutRepliesFrom drops the server's packets of each of the links'
// connections from its first request matching tr on, until Heal: that
// request reaches the server, and its answer and every later one is lost,
// while the connections that have not sent such a request go on. It hits
// one exchange that ports alone cannot pick out, such as the answer to a
// COMMIT (the server commits, the client cannot know).
func (n *Net) CutRepliesFrom(tr Trigger, links ...Link) (*Fault, error) {
	return n.add(fmt.Sprintf("cut replies from %v on: %v", tr, links), links, func(mark string) [][]string {
		return [][]string{{"-m", "connmark", "--mark", tripped(mark), "-m", "conntrack", "--ctdir", "REPLY", "-j", "DROP"}}
	}, nil, func(mark string) ([]string, [][]string) {
		// A tripped connection keeps its mark: the link's mark rule
		// passes it over, so it stays cut when the next request goes out.
		return []string{"-m", "connmark", "!", "--mark", tripped(mark)},
			[][]string{append(append([]string{"-m", "connmark", "--mark", mark}, tr.match...),
				"-j", "CONNMARK", "--set-xmark", tripped(mark)+"/0xffffffff")}
	})
}

// CutAllRepliesFrom is Cut Replies on every connection of the links from
// the moment any of them sends a request matching tr, until Heal: the
// fault begins at one chosen exchange, such as a transaction's commit,
// instead of wherever the client happens to be. The first match sets an
// entry in a list of iptables' recent match, named after the fault, that
// the drop rule checks; Heal deletes both rules and with them the list.
func (n *Net) CutAllRepliesFrom(tr Trigger, links ...Link) (*Fault, error) {
	return n.add(fmt.Sprintf("cut every reply from %v on: %v", tr, links), links, func(mark string) [][]string {
		// Loopback: the client's address, the source of the request
		// that set the entry, is the destination of every reply.
		return [][]string{{"-m", "connmark", "--mark", mark, "-m", "conntrack", "--ctdir", "REPLY",
			"-m", "recent", "--name", "phnf" + mark, "--rcheck", "--rdest", "-j", "DROP"}}
	}, nil, func(mark string) ([]string, [][]string) {
		return nil, [][]string{append(append([]string{"-m", "connmark", "--mark", mark}, tr.match...),
			"-m", "recent", "--name", "phnf"+mark, "--set", "--rsource")}
	})
}

// tripped is the mark of a CutRepliesFrom connection that sent its needle:
// the fault's mark with the id half's top bit set (ids stay below it).
func tripped(mark string) string {
	m, _ := strconv.ParseUint(mark, 0, 32)
	return fmt.Sprintf("0x%08x", uint32(m)|0x8000)
}

// Degrade delays the links' packets and drops a share of them, both ways,
// until Heal.
func (n *Net) Degrade(im Impairment, links ...Link) (*Fault, error) {
	if im.Delay < 0 || im.Jitter < 0 || im.Loss < 0 || im.Loss > 1 {
		return nil, fmt.Errorf("netfault: impairment %+v: delay and jitter must not be negative, loss within 0 and 1", im)
	}
	q, err := openQueue(n.pid, im)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("delay %v to %v, loss %.1f%%: %v", im.Delay, im.Delay+im.Jitter, im.Loss*100, links)
	f, err := n.add(what, links, func(mark string) [][]string {
		return [][]string{{"-m", "connmark", "--mark", mark, "-j", "NFQUEUE", "--queue-num", strconv.Itoa(int(q.num)), "--queue-bypass"}}
	}, q, nil)
	if err != nil {
		_, _ = q.close()
		return nil, err
	}
	return f, nil
}

// add installs a fault: the marks of its links' connections in the OUTPUT
// chain (new rules go first, so the newest fault's mark wins), then its
// actions on the marked packets in the INPUT chain. out, when set, gives
// a match the mark rules add and rules of the OUTPUT chain that follow
// them.
func (n *Net) add(what string, links []Link, actions func(mark string) [][]string, q *queue,
	out func(mark string) (markMatch []string, after [][]string)) (*Fault, error) {
	if len(links) == 0 {
		return nil, errors.New("netfault: a fault needs at least one link")
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, errors.New("netfault: closed")
	}
	n.seq++
	f := &Fault{n: n, id: n.seq, what: what, queue: q}
	n.faults[f.id] = f
	n.mu.Unlock()
	mark := n.mark(f.id)
	comment := []string{"-m", "comment", "--comment", fmt.Sprintf("netfault pid %d fault %d", n.pid, f.id)}
	var markMatch []string
	var after [][]string
	if out != nil {
		markMatch, after = out(mark)
	}
	for _, l := range links {
		if len(l.To) == 0 {
			return nil, fmt.Errorf("netfault: link %v has no ports", l)
		}
		for chunk := range slices.Chunk(l.To, 15) { // multiport takes 15 ports
			ports := make([]string, len(chunk))
			for i, p := range chunk {
				ports[i] = strconv.Itoa(p)
			}
			spec := []string{"-p", "tcp"}
			if l.From.Name != "" {
				spec = append(spec, "-m", "owner", "--uid-owner", strconv.Itoa(int(l.From.UID)))
			}
			spec = append(spec, "-m", "multiport", "--dports", strings.Join(ports, ","),
				"-m", "conntrack", "--ctdir", "ORIGINAL")
			spec = append(append(append(spec, markMatch...), comment...), "-j", "CONNMARK", "--set-xmark", mark+"/0xffffffff")
			f.rules = append(f.rules, rule{n.out, spec})
		}
	}
	for _, a := range after {
		f.rules = append(f.rules, rule{n.out, append(slices.Clone(comment), a...)})
	}
	for _, a := range actions(mark) {
		f.rules = append(f.rules, rule{n.in, append(slices.Clone(comment), a...)})
	}
	// The actions first: a connection is acted on from its first marked
	// packet on.
	for _, r := range slices.Backward(f.rules) {
		if err := iptables(append([]string{"-I", r.chain, "1"}, r.spec...)...); err != nil {
			f.queue = nil // the caller closes it
			_ = f.Heal()
			return nil, fmt.Errorf("netfault: %s: %w", what, err)
		}
	}
	return f, nil
}

// mark is fault id's connection mark: the run's pid in the high half, so
// that two runs never share one.
func (n *Net) mark(id uint32) string {
	return fmt.Sprintf("0x%08x", uint32(n.pid&0xffff)<<16|id&0x7fff)
}

// Heal removes the fault's rules: its links work again (connections
// dropped meanwhile recover by their own retransmissions or reconnects).
// Healing twice does nothing.
func (f *Fault) Heal() error {
	n := f.n
	n.mu.Lock()
	if f.healed || n.closed {
		f.healed = true
		n.mu.Unlock()
		return nil
	}
	f.healed = true
	delete(n.faults, f.id)
	n.mu.Unlock()
	var errs []error
	for _, r := range f.rules {
		if err := iptables(append([]string{"-D", r.chain}, r.spec...)...); err != nil && !isMissing(err) {
			errs = append(errs, err)
		}
	}
	// The rules are gone, so nothing more is queued: what is held goes
	// out now.
	if f.queue != nil {
		stats, err := f.queue.close()
		n.mu.Lock()
		f.stats = stats
		n.mu.Unlock()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Stats is what a Degrade fault did to its packets, complete once healed.
func (f *Fault) Stats() QueueStats {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	return f.stats
}

// Sweep removes the chains and jumps of every run whose lock is free (the
// run is dead) and returns their chain names.
func Sweep() ([]string, error) {
	out, err := iptablesOut("-S")
	if err != nil {
		return nil, err
	}
	pids := map[int]bool{}
	for _, line := range strings.Split(out, "\n") {
		name, ok := strings.CutPrefix(line, "-N "+chainPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(name, "-")
		if pid, err := strconv.Atoi(pidStr); err == nil {
			pids[pid] = true
		}
	}
	var swept []string
	for _, pid := range slices.Sorted(maps.Keys(pids)) {
		lock, err := lockFile(runLock(pid), false)
		if errors.Is(err, errLocked) {
			continue // a live run's
		}
		if err != nil {
			return swept, err
		}
		out, in := chainName(pid, "o"), chainName(pid, "i")
		if err := removeChains(out, in); err != nil {
			lock.Close()
			return swept, err
		}
		_ = os.Remove(runLock(pid))
		lock.Close()
		swept = append(swept, out, in)
	}
	return swept, nil
}

// removeChains deletes every jump to the chains from OUTPUT and INPUT,
// then the chains; what does not exist is no error.
func removeChains(chains ...string) error {
	var errs []error
	for _, builtin := range []string{"OUTPUT", "INPUT"} {
		out, err := iptablesOut("-S", builtin)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			spec, ok := strings.CutPrefix(line, "-A "+builtin+" ")
			if !ok {
				continue
			}
			for _, c := range chains {
				if strings.HasSuffix(spec, "-j "+c) {
					if err := iptables(append([]string{"-D", builtin}, strings.Fields(spec)...)...); err != nil && !isMissing(err) {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	for _, c := range chains {
		if err := iptables("-F", c); err != nil && !isMissing(err) {
			errs = append(errs, err)
			continue
		}
		if err := iptables("-X", c); err != nil && !isMissing(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// errLocked says another process holds a lock file.
var errLocked = errors.New("locked by a live process")

// lockFile opens path (creating it when create is set) and takes its
// exclusive flock without waiting; errLocked when a live process holds it.
// Without create, a missing file counts as free (a chain whose run died
// before it made, or after it removed, its lock file).
func lockFile(path string, create bool) (*os.File, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if errors.Is(err, os.ErrNotExist) && !create {
		return os.Open(os.DevNull) // something the caller can Close alike

	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, err
	}
	return f, nil
}
