package relaystore

import (
	"slices"
	"sync"

	"github.com/posthorn/posthorn/core"
)

// lowWater keeps, per shard, the id below which every outbox row is
// relayed or belongs to a parked aggregate, so a read starts its range
// scan there instead of at the shard's first queue entry: the entries the
// markers deleted below it stay out of the read, however long a snapshot
// keeps VACUUM from removing them.
//
// Invariant: a mark is raised only to an id that the read proves is the
// lowest unrelayed, unparked row of its shard, and never past the last id
// L of a completed tick. A tick is (L, M), read as two points in time: L,
// the last id the sequence had given out, then M, the next transaction ID
// to be assigned. Every transaction that took an id up to L had its
// transaction ID first (migration 00016's column default), hence below M.
// Once a read's snapshot shows the oldest running transaction at or past
// M, every such transaction has ended, so each row with an id up to L is
// committed and visible to the read, or rolled back: no late commit can
// appear below a mark. A row the read skips because its marker is still
// in flight (skip) is unrelayed too, so no mark passes it. The store
// checks the invariant against the ledger about once a minute (audit.go).
//
// A transaction that holds a transaction ID somewhere on the server keeps
// the oldest running one from moving: then the newest pending tick (L, M)
// is complete as soon as no transaction that writes the outbox (holds its
// write lock, which an insert takes before its id and keeps to its end) is
// older than its M; that is asked only while the marks are stuck, since
// it reads the server's lock table. The answer completes that tick and
// the ticks before it, never one with a greater last id: with relays
// sharing the marks, another read may have made a tick after the lock
// table was read, with the same M (no transaction ID was assigned in
// between) but a last id that a transaction older than M took after the
// lock table showed it holding no write lock. And it holds only under the
// generation the asked tick was made in: after a failover, M names a
// transaction ID of the old primary, and the new one's ticks may have
// smaller last ids.
//
// Parked aggregates' rows are not read and may lie below a mark; when a
// park is deleted (a release or a dead-letter), the trigger on
// relay_parked moves the generation in relay_release in the same
// transaction, and the first read that sees the move drops every mark. A
// read sees the move together with the delete or not at all; a counter
// outside the transaction (a sequence) is seen first, and a read in
// between would skip the released rows and raise marks past them under
// the generation that was to announce them. The marks are a property of
// the ledger, not of a relay, so one store may serve several relays and a
// relay may lose and take back a shard.
//
// Marks and ticks hold for one history of the server only. After a
// failover the promoted standby may give out again outbox ids and
// transaction IDs the old primary had given (what it never received), so
// a tick of the old primary would complete on the new one and raise marks
// over rows the new primary commits later. A read that sees another
// history (system identifier, timeline) drops every mark and tick, as a
// release does. (Counters that go back are no sign of it: reads of
// several relays sharing the store overlap.)
//
// A read reads the release generation and the history in its own
// transaction, so it knows what it saw; one that started above zero from
// marks made under another generation is thrown away and made again from
// the marks that generation left (none): a released aggregate's rows are
// read whole and in order, also while other relays' reads overlap.
type lowWater struct {
	mu    sync.Mutex
	mark  map[int]int64
	ticks []tick
	// stuck: the last read completed no tick although one was pending.
	stuck bool
	// gen is what the marks were made under; its release is -1 before
	// the first read.
	gen generation
	// unsafe switches a rule off for the tests' negative controls.
	unsafe unsafeLowWater
}

// unsafeLowWater are the rules a negative control switches off (the first
// two make the marks unsafe, the last one makes them slow); the zero value
// is production.
type unsafeLowWater struct {
	// trustEveryRead raises marks after every read, as if each read saw
	// every transaction that took an id ended: a late commit falls below
	// a mark.
	trustEveryRead bool
	// ignoreReleases keeps the marks when a park is deleted: the released
	// aggregate's rows below them are never read again.
	ignoreReleases bool
	// ignoreHistory keeps the marks and ticks across a failover: a tick of
	// the old primary completes on the new one over ids it gives out again.
	ignoreHistory bool
	// ignoreWriters completes a tick only once the oldest running
	// transaction has passed it, whatever it writes: any open transaction
	// that holds a transaction ID stops the marks (safe, and slow).
	ignoreWriters bool
	// xmaxAsNext takes a snapshot's xmax for a tick's next transaction ID:
	// it is the latest completed one plus one, and a transaction still
	// running may hold a greater ID and an id below the tick's last.
	xmaxAsNext bool
	// writersByNext lets an answer about the outbox's writers complete
	// every tick whose next is not past the one asked about, also a tick
	// made after the lock table was read.
	writersByNext bool
	// writersOfAnyGeneration lets that answer complete ticks of another
	// generation than the asked tick's.
	writersOfAnyGeneration bool
}

// tick is an outbox id given out (last) and a transaction ID assigned after
// it was read (next).
type tick struct{ last, next int64 }

// horizon is what a read returns besides its rows.
type horizon struct {
	// xmin is the oldest running transaction at the start of the read.
	xmin int64
	// last is the last outbox id given out, next the next transaction ID
	// assigned after last was read: a new tick.
	last, next int64
	// release is the generation in relay_release.
	release int64
	// history is the server's.
	history history
	// writers is the tick whose next transaction ID the read asked about
	// (lowWater.writersBefore), the zero tick for none, and writersGen the
	// generation it was made in; noWriterBefore: no transaction that
	// writes the outbox is older than that ID.
	writers        tick
	writersGen     generation
	noWriterBefore bool
}

// history names one linear history of a server: a failover changes the
// timeline, a restore elsewhere the system identifier.
type history struct {
	system   int64
	timeline int32
}

// generation is what marks hold under: the server's history and the
// release generation (relay_release). A read uses its marks only if it saw
// the generation they were made under.
type generation struct {
	release int64
	history history
	// drops counts the audits that dropped the marks (audit.go).
	drops int64
}

// withoutDrops is g as a read sees it: the drops are the store's own.
func (g generation) withoutDrops() generation {
	g.drops = 0
	return g
}

// newer reports whether g comes after w: another history (the server's
// now, as a failover leaves one history behind for good), or a later
// release on the same one.
func (g generation) newer(w generation) bool {
	return g.history != w.history || g.release > w.release
}

// maxTicks bounds the ticks kept while none completes (a transaction that
// holds a transaction ID stays open): the newest replaces the last kept,
// which only delays a mark, never moves one too far.
const maxTicks = 64

func newLowWater() *lowWater { return &lowWater{mark: map[int]int64{}, gen: generation{release: -1}} }

// writersBefore is the tick whose next transaction ID the next read asks
// about (the newest pending tick), or the zero tick while the ticks
// complete as they should, and the generation it was made in.
func (w *lowWater) writersBefore() (tick, generation) {
	if w == nil {
		return tick{}, generation{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stuck || len(w.ticks) == 0 {
		return tick{}, w.gen
	}
	return w.ticks[len(w.ticks)-1], w.gen
}

// completes reports whether a read that saw h completes t, a tick of the
// marks' generation.
func (w *lowWater) completes(t tick, h horizon) bool {
	switch {
	case t.next <= h.xmin || w.unsafe.trustEveryRead:
		return true
	case !h.noWriterBefore || w.unsafe.ignoreWriters:
		return false
	case h.writersGen != w.gen && !w.unsafe.writersOfAnyGeneration:
		return false
	case w.unsafe.writersByNext:
		return t.next <= h.writers.next
	}
	return t.last <= h.writers.last
}

// marks returns the marks of shards (0 for none), aligned with shards,
// and what they were made under; a nil lowWater reads every shard from
// its start.
func (w *lowWater) marks(shards []int) ([]int64, generation) {
	out := make([]int64, len(shards))
	if w == nil {
		return out, generation{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, s := range shards {
		out[i] = w.mark[s]
	}
	return out, w.gen
}

// seen is the generation of a read that saw h, as the unsafe switches
// let it be seen.
func (w *lowWater) seen(h horizon) generation {
	g := generation{release: h.release, history: h.history}
	if w.unsafe.ignoreReleases {
		g.release = 0
	}
	if w.unsafe.ignoreHistory {
		g.history = history{}
	}
	return g
}

// drop drops every mark, after an audit found a row below one; a read that
// started from the marks before is thrown away, as after a release.
func (w *lowWater) drop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.mark)
	w.gen.drops++
}

// advance raises the marks of shards after a read from the marks lows,
// made under gen, that returned rows (each shard's lowest unrelayed,
// unparked rows not in skip, in id order) and saw h. It reports false
// when the read must be thrown away: it started above zero from marks of
// another generation than it saw (a park was deleted since, the server
// runs another history, or an audit dropped the marks), so rows of an
// aggregate below them may be missing while its later rows are there. A read again from the marks,
// which the newer generation dropped, is whole. A read that saw an older
// generation than the marks' now (another relay's read was quicker) is
// whole in itself but moves no mark.
func (w *lowWater) advance(shards []int, lows []int64, gen generation, rows []core.OutboxRow, skip []int64, h horizon) bool {
	if w == nil {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	saw := w.seen(h)
	saw.drops = w.gen.drops
	if saw.newer(w.gen) {
		// A park was deleted since the marks were made (the released
		// rows may lie below them), another history runs (the ids and
		// transaction IDs the marks and ticks speak of no longer mean
		// the same), or this is the first read.
		clear(w.mark)
		w.ticks = w.ticks[:0]
		w.gen = saw
	}
	if saw != gen && slices.ContainsFunc(lows, func(l int64) bool { return l > 0 }) {
		return false
	}
	if saw != w.gen {
		return true
	}
	done, proved := int64(0), false
	for len(w.ticks) > 0 && w.completes(w.ticks[0], h) {
		done, proved = w.ticks[0].last, true
		w.ticks = w.ticks[1:]
	}
	w.stuck = !proved && len(w.ticks) > 0
	switch {
	case len(w.ticks) > 0 && w.ticks[len(w.ticks)-1].last >= h.last:
	case len(w.ticks) < maxTicks:
		w.ticks = append(w.ticks, tick{last: h.last, next: h.next})
	default:
		w.ticks[len(w.ticks)-1] = tick{last: h.last, next: h.next}
	}
	if !proved {
		return true
	}
	// The lowest row each shard still has to send: the first the read
	// returned, or one whose marker is in flight.
	floor := done + 1
	if len(skip) > 0 {
		floor = min(floor, slices.Min(skip))
	}
	first := make(map[int]int64, len(shards))
	for _, r := range rows {
		if f, ok := first[r.Shard]; !ok || r.ID < f {
			first[r.Shard] = r.ID
		}
	}
	for _, s := range shards {
		m := floor
		if f, ok := first[s]; ok {
			m = min(m, f)
		}
		if m > w.mark[s] {
			w.mark[s] = m
		}
	}
	return true
}
