package relaystore

import (
	"testing"

	"github.com/posthorn/posthorn/core"
)

// Two relays share one store's marks and their reads overlap: B takes its
// marks, A's read sees a release, which drops them, and is made again,
// then B's read, made from the old marks but in a transaction that saw
// the release, comes back. B's read is thrown away as A's first was (its released aggregate's rows below the old
// marks are missing), and a read that saw an older generation than the
// marks' now keeps its rows but moves no mark. Control: a store that
// ignores releases takes B's read.
func TestLowWaterThrowsAwayAReadFromMarksOfAnotherGeneration(t *testing.T) {
	shards := []int{0}
	hist := history{system: 7, timeline: 1}
	at := func(release, xmin, last, next int64) horizon {
		return horizon{xmin: xmin, last: last, next: next, release: release, history: hist}
	}
	row := func(id int64) []core.OutboxRow { return []core.OutboxRow{{RowRef: core.RowRef{ID: id, Shard: 0}}} }
	for _, control := range []bool{false, true} {
		w := newLowWater()
		w.unsafe.ignoreReleases = control
		// Marks rise: one read makes a tick, the next completes it.
		lows, gen := w.marks(shards)
		w.advance(shards, lows, gen, nil, nil, at(1, 10, 20, 30))
		lows, gen = w.marks(shards)
		w.advance(shards, lows, gen, nil, nil, at(1, 30, 20, 31))
		bLows, bGen := w.marks(shards)
		if bLows[0] != 21 {
			t.Fatalf("control %v: mark %d after a completed tick of id 20, want 21", control, bLows[0])
		}
		// A's read from the marks sees release 2: the marks drop, the read
		// is thrown away, and A's read again starts from none.
		lows, gen = w.marks(shards)
		if used := w.advance(shards, lows, gen, row(22), nil, at(2, 31, 25, 32)); used == !control {
			t.Fatalf("control %v: A's read from the marks of release 1 that saw release 2 was used: %v", control, used)
		}
		if lows, gen = w.marks(shards); !control && lows[0] != 0 {
			t.Fatalf("marks %v after a release, want none", lows)
		}
		if !w.advance(shards, lows, gen, row(5), nil, at(2, 31, 25, 32)) {
			t.Fatalf("control %v: A's read again from %v under %v was thrown away", control, lows, gen)
		}
		// B's read from the old marks saw release 2 as well.
		usedB := w.advance(shards, bLows, bGen, row(22), nil, at(2, 31, 25, 32))
		if usedB == !control {
			t.Fatalf("control %v: B's read from the marks of release 1 that saw release 2 was used: %v", control, usedB)
		}
		if control {
			continue
		}
		// A read that saw release 1 after the marks moved to 2 keeps its
		// rows and moves nothing.
		before, _ := w.marks(shards)
		if !w.advance(shards, []int64{0}, generation{release: 1, history: hist}, row(5), nil, at(1, 40, 25, 41)) {
			t.Fatal("a read from no marks that saw an older release was thrown away")
		}
		if after, g := w.marks(shards); after[0] != before[0] || g.release != 2 {
			t.Fatalf("a read that saw release 1 moved the marks %v → %v under %v", before, after, g)
		}
	}
}

// Two relays share one store's marks while a transaction that holds a
// transaction ID keeps the oldest running one from moving. A's read asks
// about the outbox's writers older than the newest tick's next (none
// hold the write lock yet); before A's read comes back, that transaction
// takes outbox id 9 and B's read makes a tick with last 9 and the same
// next (no transaction ID was assigned in between). A's answer completes
// the tick it asked about (last 5) and not B's: its mark stops at 6, below
// the uncommitted row 9 it could not see. Control: completing by next
// alone takes B's tick and raises the mark to 10, over row 9.
func TestLowWaterCompletesOnlyTheTickItAskedTheWritersAbout(t *testing.T) {
	shards := []int{0}
	hist := history{system: 7, timeline: 1}
	for _, control := range []bool{false, true} {
		w := newLowWater()
		w.unsafe.writersByNext = control
		at := func(xmin, last, next int64) horizon {
			return horizon{xmin: xmin, last: last, next: next, release: 1, history: hist}
		}
		// A transaction with ID 40 stays open: a tick (5, 41), then a
		// read that completes nothing, so the marks are stuck.
		for range 2 {
			lows, gen := w.marks(shards)
			w.advance(shards, lows, gen, nil, nil, at(40, 5, 41))
		}
		asked, askedGen := w.writersBefore()
		if asked != (tick{last: 5, next: 41}) {
			t.Fatalf("control %v: the read asks about %+v, want the pending tick (5, 41)", control, asked)
		}
		aLows, aGen := w.marks(shards)
		// B's read, made after A's saw the lock table, sees id 9 given out.
		lows, gen := w.marks(shards)
		w.advance(shards, lows, gen, nil, nil, at(40, 9, 41))
		// A's read comes back: no writer older than 41 held the lock.
		answerWritersAndWant(t, w, control, at(40, 9, 41), asked, askedGen, aLows, aGen, map[bool]int64{false: 6, true: 10})
	}
}

// A read asks about the outbox's writers older than a tick of the old
// primary; a failover happens; another relay's read on the promoted
// standby drops the marks and ticks and makes a tick of the new history,
// whose ids and transaction IDs start lower (last 3, next 12). A's read,
// made on the new primary, comes back with no writer older than the old
// primary's 41: that says nothing of the new primary's transactions, and
// the mark stays at 0. Control: an answer used across generations
// completes the new tick and raises the mark to 4, over rows 1 to 3 the
// new primary may still commit.
func TestLowWaterAnswerAboutWritersHoldsInItsGenerationOnly(t *testing.T) {
	shards := []int{0}
	before, after := history{system: 7, timeline: 1}, history{system: 7, timeline: 2}
	for _, control := range []bool{false, true} {
		w := newLowWater()
		w.unsafe.writersOfAnyGeneration = control
		at := func(hist history, xmin, last, next int64) horizon {
			return horizon{xmin: xmin, last: last, next: next, release: 1, history: hist}
		}
		for range 2 {
			lows, gen := w.marks(shards)
			w.advance(shards, lows, gen, nil, nil, at(before, 40, 5, 41))
		}
		aLows, aGen := w.marks(shards)
		asked, askedGen := w.writersBefore()
		if asked != (tick{last: 5, next: 41}) {
			t.Fatalf("control %v: the read asks about %+v, want the pending tick (5, 41)", control, asked)
		}
		// B's read on the promoted standby.
		lows, gen := w.marks(shards)
		w.advance(shards, lows, gen, nil, nil, at(after, 10, 3, 12))
		// A's read, on the new primary too.
		answerWritersAndWant(t, w, control, at(after, 10, 3, 12), asked, askedGen, aLows, aGen, map[bool]int64{false: 0, true: 4})
	}
}

// answerWritersAndWant advances w with a read from lows under gen that saw
// h and no writer of the outbox older than the asked tick's next, and
// fails t unless shard 0's mark is then want[control].
func answerWritersAndWant(t *testing.T, w *lowWater, control bool, h horizon, asked tick, askedGen generation,
	lows []int64, gen generation, want map[bool]int64) {
	t.Helper()
	h.writers, h.writersGen, h.noWriterBefore = asked, askedGen, true
	w.advance([]int{0}, lows, gen, nil, nil, h)
	mark, _ := w.marks([]int{0})
	t.Logf("control %v: mark %d", control, mark[0])
	if mark[0] != want[control] {
		t.Fatalf("control %v: mark %d, want %d", control, mark[0], want[control])
	}
}
