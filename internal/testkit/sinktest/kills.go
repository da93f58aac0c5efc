package sinktest

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/posthorn/posthorn/core"
)

// KillCase is the name of the broker-kill subtest of Run, for factories
// that start a broker they may kill only for it (t.Name() ends with it).
const KillCase = "BrokerKillsLoseNoAck"

// midBatchTries is how many Publish calls a kill waits through for one
// still running when the kill is due.
const midBatchTries = 10

// KillOptions shape one broker-kill run; the zero value is the
// conformance case's.
type KillOptions struct {
	// Kills is the number of SIGKILLs (default 5).
	Kills int
	// Duration, when set, keeps killing until it has passed (and at least
	// Kills times): the long runs of the soak.
	Duration time.Duration
	// BatchSize is the records per Publish (default 300).
	BatchSize int
	// Keys is the number of aggregates the records spread over (default 64).
	Keys int
	// Up is the least time the broker runs between a restart and the next
	// kill, and at least 5 batches are ACKed in it (default 1 s).
	Up time.Duration
	// MaxDown is the longest the broker stays dead before its restart is
	// begun; each outage lasts a random part of it (default 300 ms).
	MaxDown time.Duration
	// Pause is the publisher's rest between batches (default none): a
	// broker of several JVMs restarting on a small machine competes with
	// a publisher that never rests for the same cores.
	Pause time.Duration
}

func (o *KillOptions) setDefaults() {
	if o.Kills == 0 {
		o.Kills = 5
	}
	if o.BatchSize == 0 {
		o.BatchSize = 300
	}
	if o.Keys == 0 {
		o.Keys = 64
	}
	if o.Up == 0 {
		o.Up = time.Second
	}
	if o.MaxDown == 0 {
		o.MaxDown = 300 * time.Millisecond
	}
}

// KillReport is what a broker-kill run saw.
type KillReport struct {
	Kills int
	// MidBatch counts the kills that came while a Publish was running.
	MidBatch int
	Batches  int // Publish calls
	Failed   int // Publish calls that returned an error
	Sent     int // records handed to Publish, resends included
	// Acked is the number of distinct records the sink ACKed: Publish
	// returned nil, or they were not in *core.BatchError.Failed.
	Acked int
	// Absent is the number of ACKed records not on the broker: the loss.
	Absent int
	// OnBroker is the number of records read back, duplicates included.
	OnBroker int
	// OutOfOrder counts ACKed records on the broker that are not in order:
	// per key, the longest run of the key's ACKed revisions that can be
	// read in increasing order, one copy each (repeats skipped), leaves
	// them out. A consumer would apply them after a later revision.
	OutOfOrder int
	// Inversions counts ACKed records whose first copy on the broker comes
	// after the first copy of a later revision of their key that was
	// ACKed too (it was stored before its predecessor, unACKed, and its
	// resend ACKed later). The consumers' gap hold absorbs this; it is
	// reported, not failed.
	Inversions int
	// Overtaken counts records ACKed in a batch in which an earlier record
	// of the same key failed (the sink must fail those too).
	Overtaken int
	// Permanent counts records failed as permanent (an outage is not).
	Permanent int
	// Example names a few absent or out-of-order records.
	Example []string
}

func testKills(t *testing.T, f Factory) {
	if testing.Short() {
		t.Skip("kills and restarts a broker process")
	}
	h := f(t)
	if h.Kill == nil {
		t.Skip("harness cannot kill its broker")
	}
	r := MeasureKills(t, h, h.KillOptions)
	if r.Absent > 0 {
		t.Errorf("%d of %d ACKed records are not on the broker (e.g. %v): an ACK that was not stored", r.Absent, r.Acked, r.Example)
	}
	if r.OutOfOrder > 0 {
		t.Errorf("%d ACKed records are on the broker only before an earlier ACKed revision of their key (e.g. %v)", r.OutOfOrder, r.Example)
	}
	if r.Overtaken > 0 {
		t.Errorf("%d records ACKed although an earlier record of their key failed in the same batch", r.Overtaken)
	}
	if r.Permanent > 0 {
		t.Errorf("%d records failed as permanent during broker kills; an outage is retryable", r.Permanent)
	}
	if r.MidBatch == 0 {
		t.Errorf("none of the %d kills landed while a Publish was running", r.Kills)
	}
}

// MeasureKills publishes continuously to h.Sink while h.Kill kills the
// broker (SIGKILL) and restarts it, mid-batch, o.Kills times, then reads
// the topic back and compares it with what the sink ACKed. It publishes as
// the relay does: batches in outbox order over many keys, revisions
// increasing per key, and after a failure each key is resent from its first
// unACKed record with the same event IDs. It fails t only when the run
// itself cannot go on (the sink never recovers, the topic cannot be read);
// what it measured is in the report, for the caller to judge: the
// conformance case wants no loss, a negative control wants some.
func MeasureKills(t *testing.T, h Harness, o KillOptions) KillReport {
	t.Helper()
	o.setDefaults()
	p := &killPublisher{
		sink: h.Sink, o: o,
		keys:    make([]killKey, o.Keys),
		acked:   map[string]killAck{},
		started: make(chan struct{}),
		ackedCh: make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go p.run()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(p.stop)
			<-p.done
		}
	}
	defer stop()

	began := time.Now()
	kills, midBatch := 0, 0
	for kills < o.Kills || (o.Duration > 0 && time.Since(began) < o.Duration) {
		p.waitUp(t, o.Up)
		// Land the kill inside a Publish: wait for one to start, then let
		// it run a random part of the first half of a typical batch's time.
		// A batch quicker than that has ended by then: wait for the next
		// one rather than kill between batches, a few times at most.
		for try := 1; ; try++ {
			select {
			case <-p.started:
			case <-time.After(30 * time.Second):
				t.Fatalf("no Publish started within 30 s")
			}
			// (These sleeps shape the fault; nothing waits on them.)
			time.Sleep(time.Duration(rand.Int64N(int64(p.typical()/2) + 1)))
			if p.inflight.Load() {
				midBatch++
				break
			}
			if try == midBatchTries {
				break
			}
		}
		restart := h.Kill(t)
		kills++
		time.Sleep(time.Duration(rand.Int64N(int64(o.MaxDown) + 1)))
		restart()
	}
	p.waitUp(t, o.Up) // the sink recovered after the last restart
	stop()

	r := p.report()
	r.Kills, r.MidBatch = kills, midBatch
	checkBroker(t, h, p.acked, &r)
	t.Logf("broker kills: %d kills (%d mid-batch) in %v; %d batches (%d failed), %d records sent, %d ACKed, %d on the broker; ACKed but absent: %d; out of order: %d (first copies inverted: %d); overtaken: %d; permanent: %d",
		r.Kills, r.MidBatch, time.Since(began).Round(100*time.Millisecond), r.Batches, r.Failed, r.Sent, r.Acked, r.OnBroker, r.Absent, r.OutOfOrder, r.Inversions, r.Overtaken, r.Permanent)
	return r
}

type killRec struct {
	seq int64 // outbox order
	key int
	env core.Envelope
}

// killAck is what the check needs of an ACKed record (runs ACK millions).
type killAck struct {
	seq int64
	key int32
	rev int64
}

func (a killAck) String() string {
	return "acc-kill-" + strconv.Itoa(int(a.key)) + " r" + strconv.FormatInt(a.rev, 10)
}

type killKey struct {
	rev     int64     // last revision generated
	pending []killRec // from the first unACKed record on
}

// killPublisher is the relay-like load of MeasureKills; its fields after
// mu are shared with the killing goroutine.
type killPublisher struct {
	sink core.Sink
	o    KillOptions
	keys []killKey
	seq  int64

	started  chan struct{} // a Publish is about to begin (unbuffered, offered)
	ackedCh  chan struct{} // a batch had ACKs (buffered 1, offered)
	stop     chan struct{}
	done     chan struct{}
	inflight atomic.Bool  // a Publish is running
	okCount  atomic.Int64 // batches with at least one ACK
	lastOK   atomic.Int64 // duration of the last wholly ACKed batch, ns

	mu    sync.Mutex
	acked map[string]killAck // event ID → record
	r     KillReport
}

func (p *killPublisher) typical() time.Duration {
	if d := time.Duration(p.lastOK.Load()); d > 0 {
		return d
	}
	return 10 * time.Millisecond
}

// waitUp returns once up has passed and at least 5 more batches had ACKs.
func (p *killPublisher) waitUp(t *testing.T, up time.Duration) {
	t.Helper()
	target := p.okCount.Load() + 5
	minUntil := time.Now().Add(up)
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	for p.okCount.Load() < target || time.Now().Before(minUntil) {
		var upPassed <-chan time.Time
		if d := time.Until(minUntil); d > 0 {
			upPassed = time.After(d)
		}
		select {
		case <-p.ackedCh:
		case <-upPassed:
		case <-p.done:
			t.Fatalf("the publisher stopped")
		case <-timeout.C:
			t.Fatalf("the sink ACKed %d batches in the 60 s after the broker's restart, want 5", p.okCount.Load()-target+5)
		}
	}
}

func (p *killPublisher) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		batch := p.next()
		envs := make([]core.Envelope, len(batch))
		for i, r := range batch {
			envs[i] = r.env
		}
		select {
		case p.started <- struct{}{}:
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		began := time.Now()
		p.inflight.Store(true)
		err := p.sink.Publish(ctx, envs)
		p.inflight.Store(false)
		took := time.Since(began)
		cancel()
		n := p.settle(batch, err)
		if err == nil {
			p.lastOK.Store(int64(took))
		}
		if p.o.Pause > 0 {
			select {
			case <-p.stop:
				return
			case <-time.After(p.o.Pause):
			}
		}
		if n > 0 {
			p.okCount.Add(1)
			select {
			case p.ackedCh <- struct{}{}:
			default:
			}
		} else {
			// Back off as the relay does; the broker is down.
			select {
			case <-p.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// next builds a batch: every pending record of every key, in outbox order,
// then new records on random keys up to the batch size.
func (p *killPublisher) next() []killRec {
	var batch []killRec
	for k := range p.keys {
		batch = append(batch, p.keys[k].pending...)
	}
	slices.SortFunc(batch, func(a, b killRec) int { return cmp.Compare(a.seq, b.seq) })
	for len(batch) < p.o.BatchSize {
		k := rand.IntN(len(p.keys))
		key := &p.keys[k]
		key.rev++
		p.seq++
		r := killRec{seq: p.seq, key: k, env: Envelope(core.TopicEvents, "acc-kill-"+strconv.Itoa(k), key.rev)}
		key.pending = append(key.pending, r)
		batch = append(batch, r)
	}
	return batch
}

// settle records what the sink ACKed of batch and drops each key's ACKed
// prefix from pending; it returns the number of records ACKed.
func (p *killPublisher) settle(batch []killRec, err error) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.r.Batches++
	p.r.Sent += len(batch)
	ok := func(int) bool { return true }
	if err != nil {
		p.r.Failed++
		var be *core.BatchError
		if !errors.As(err, &be) {
			ok = func(int) bool { return false }
		} else {
			for _, e := range be.Failed {
				if core.IsPermanent(e) {
					p.r.Permanent++
				}
			}
			ok = func(i int) bool { return be.Failed[i] == nil }
		}
	}
	n := 0
	failedKey := map[string]bool{}
	for i, r := range batch {
		agg := r.env.AggregateID
		if !ok(i) {
			failedKey[agg] = true
			continue
		}
		if failedKey[agg] {
			p.r.Overtaken++
		}
		p.acked[r.env.EventID] = killAck{seq: r.seq, key: int32(r.key), rev: r.env.Revision}
		n++
	}
	for k := range p.keys {
		key := &p.keys[k]
		i := 0
		for i < len(key.pending) {
			if _, done := p.acked[key.pending[i].env.EventID]; !done {
				break
			}
			i++
		}
		key.pending = key.pending[i:]
	}
	return n
}

func (p *killPublisher) report() KillReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.r
	r.Acked = len(p.acked)
	return r
}

// checkBroker reads the topic back until every ACKed record is seen or the
// broker has no more, and fills in Absent, OnBroker, OutOfOrder and
// Inversions.
func checkBroker(t *testing.T, h Harness, acked map[string]killAck, r *KillReport) {
	t.Helper()
	n := len(acked)
	var recs []Record
	var seen map[string]bool
	missing := n
	// Reading millions of records takes a while on a busy machine.
	wait := 30*time.Second + time.Duration(n/20000)*time.Second
	for prev := -1; ; {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		got, err := h.Read(ctx, core.TopicEvents, n)
		cancel()
		if len(got) == 0 && err != nil {
			t.Fatalf("read the topic back: %v", err)
		}
		recs = got
		seen = make(map[string]bool, len(recs))
		for _, rec := range recs {
			seen[rec.Headers[core.HeaderEventID]] = true
		}
		missing = 0
		for id := range acked {
			if !seen[id] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if err == nil {
			// A reader that stops at n records may not have reached the
			// rest (repeats count towards n): ask for more.
			n = len(recs) + missing
			continue
		}
		// Fewer than n came before the deadline: the broker has no more,
		// unless the reader was still reading. Read again for longer until
		// a read brings nothing new.
		if len(recs) <= prev {
			break
		}
		prev = len(recs)
		wait *= 2
	}
	r.OnBroker = len(recs)
	r.Absent = missing
	// Per key, the ACKed revisions on the broker in increasing order; a
	// greedy scan of the broker's order matches as many as can be read in
	// that order, one copy each.
	want := map[int32][]int64{}
	for id, a := range acked {
		if seen[id] {
			want[a.key] = append(want[a.key], a.rev)
		}
	}
	for _, revs := range want {
		slices.Sort(revs)
	}
	matched := map[int32]int{}
	first := map[string]bool{}
	last := map[int32]int64{}
	for _, rec := range recs {
		id := rec.Headers[core.HeaderEventID]
		a, ok := acked[id]
		if !ok {
			continue
		}
		if m := matched[a.key]; m < len(want[a.key]) && want[a.key][m] == a.rev {
			matched[a.key]++
		}
		if first[id] {
			continue
		}
		first[id] = true
		if a.rev < last[a.key] {
			r.Inversions++
			continue
		}
		last[a.key] = a.rev
	}
	for key, revs := range want {
		if m := matched[key]; m < len(revs) {
			r.OutOfOrder += len(revs) - m
			if len(r.Example) < 5 {
				r.Example = append(r.Example, killAck{key: key, rev: revs[m]}.String()+" not after its predecessor")
			}
		}
	}
	if missing > 0 {
		var absent []killAck
		for id, a := range acked {
			if !seen[id] {
				absent = append(absent, a)
			}
		}
		slices.SortFunc(absent, func(a, b killAck) int { return cmp.Compare(a.seq, b.seq) })
		for _, a := range absent[:min(5, len(absent))] {
			r.Example = append(r.Example, "absent "+a.String())
		}
	}
}
