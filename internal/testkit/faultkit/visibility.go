package faultkit

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
)

// VisibilityWatch reads the event topic while a run goes on, with two
// franz-go readers of its own: read_uncommitted, keeping the transaction
// markers (control records), and read_committed. From what each received,
// and when, it tells which records belong to aborted transactions, whether
// the read_committed reader received any of them or missed a committed
// one, and how long each event the ledger marked relayed stayed invisible
// to it after it was on the log (the read_uncommitted reader had it). It
// trusts nothing of the relay's: only the broker's records and markers.
type VisibilityWatch struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
	ru, rc *kgo.Client
	adm    *kadm.Client

	mu sync.Mutex
	// ruRecs are the read_uncommitted reader's records, markers included,
	// in the order received (per partition in offset order); ruAt when
	// each was received.
	ruRecs []*kgo.Record
	ruAt   []time.Time
	// rcSeen is, per partition and offset, when the read_committed reader
	// received the record; rcFirst per event ID the first receipt.
	rcSeen  map[int32]map[int64]time.Time
	rcFirst map[string]time.Time
	rcRecs  int
}

// WatchVisibility starts reading the event topic from its start.
func WatchVisibility(brokers []string) (*VisibilityWatch, error) {
	common := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(core.TopicEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200 * time.Millisecond),
		// The topic appears when the relay first publishes.
		kgo.AllowAutoTopicCreation(), kgo.MetadataMinAge(250 * time.Millisecond)}
	ru, err := kgo.NewClient(append(slices.Clone(common), kgo.KeepControlRecords())...)
	if err != nil {
		return nil, err
	}
	rc, err := kgo.NewClient(append(slices.Clone(common), kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		ru.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &VisibilityWatch{cancel: cancel, ru: ru, rc: rc, adm: kadm.NewClient(ru),
		rcSeen: map[int32]map[int64]time.Time{}, rcFirst: map[string]time.Time{}}
	w.done.Go(func() {
		for ctx.Err() == nil {
			fs := ru.PollFetches(ctx)
			now := time.Now()
			w.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) { w.ruRecs, w.ruAt = append(w.ruRecs, r), append(w.ruAt, now) })
			w.mu.Unlock()
		}
	})
	w.done.Go(func() {
		for ctx.Err() == nil {
			fs := rc.PollFetches(ctx)
			now := time.Now()
			w.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				w.rcRecs++
				if w.rcSeen[r.Partition] == nil {
					w.rcSeen[r.Partition] = map[int64]time.Time{}
				}
				w.rcSeen[r.Partition][r.Offset] = now
				if id := kafkatest.Header(r, core.HeaderEventID); id != "" {
					if _, ok := w.rcFirst[id]; !ok {
						w.rcFirst[id] = now
					}
				}
			})
			w.mu.Unlock()
		}
	})
	return w, nil
}

// Visibility is what a VisibilityWatch found.
type Visibility struct {
	// Records is what the read_uncommitted reader received (markers not
	// counted); Committed and Aborted split them by their transaction's
	// outcome (records outside transactions count as committed); Open are
	// records whose transaction had no marker when the watch stopped.
	Records, Committed, Aborted, Open int
	// AbortedTxns and CommittedTxns count the transactions that ended
	// with an abort or a commit marker: a transaction writes one marker on
	// each partition it touched, so per producer ID and epoch the count is
	// the most markers of that kind on one partition (a lower bound when a
	// producer's consecutive transactions touched different partitions).
	AbortedTxns, CommittedTxns int
	// ReadCommitted is what the read_committed reader received;
	// AbortedReads how many of those were records of aborted transactions;
	// MissedCommitted how many committed records it did not receive.
	ReadCommitted, AbortedReads, MissedCommitted int
	// MaxInvisible is the longest a committed record stayed invisible to
	// the read_committed reader after the read_uncommitted one had it (a
	// transaction open before it on its partition holds it back);
	// AfterHeal the longest a committed record that was on the log before
	// the last heal stayed invisible after that heal.
	MaxInvisible, AfterHeal time.Duration
}

func (v Visibility) String() string {
	return fmt.Sprintf("read_uncommitted %d records (%d committed, %d aborted in %d transactions, %d open; %d committed transactions); read_committed %d records, %d aborted reads, %d committed missed; committed records invisible to read_committed at most %v after they were on the log, %v after the heal",
		v.Records, v.Committed, v.Aborted, v.AbortedTxns, v.Open, v.CommittedTxns, v.ReadCommitted, v.AbortedReads, v.MissedCommitted,
		v.MaxInvisible.Round(10*time.Millisecond), v.AfterHeal.Round(10*time.Millisecond))
}

// Stop waits until both readers have read to the end of every partition
// (the read_committed one to the last stable offset, which an open
// transaction holds back: it waits up to wait for that), stops them and
// returns what they saw. lastHeal is the last fault's heal (zero: none).
func (w *VisibilityWatch) Stop(ctx context.Context, lastHeal time.Time, wait time.Duration) (Visibility, error) {
	defer w.close()
	deadline := time.Now().Add(wait)
	for {
		caughtUp, err := w.caughtUp(ctx)
		if err != nil {
			return Visibility{}, err
		}
		if caughtUp || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return Visibility{}, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	w.cancel()
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.report(lastHeal), nil
}

// caughtUp reports whether the read_uncommitted reader reached every
// partition's high-water mark, the last stable offset equals it (no
// transaction open) and the read_committed reader reached it too.
func (w *VisibilityWatch) caughtUp(ctx context.Context) (bool, error) {
	hwm, err := w.adm.ListEndOffsets(ctx, core.TopicEvents)
	if err != nil {
		return false, err
	}
	lso, err := w.adm.ListCommittedOffsets(ctx, core.TopicEvents)
	if err != nil {
		return false, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	next := map[int32]int64{}
	for _, r := range w.ruRecs {
		next[r.Partition] = max(next[r.Partition], r.Offset+1)
	}
	ok := true
	hwm.Each(func(o kadm.ListedOffset) {
		l, _ := lso.Lookup(o.Topic, o.Partition)
		if o.Err != nil || l.Offset != o.Offset || next[o.Partition] < o.Offset {
			ok = false
		}
	})
	if !ok {
		return false, nil
	}
	// Every transaction has its marker and the read_committed reader has
	// every committed record.
	v := w.report(time.Time{})
	return v.Open == 0 && v.MissedCommitted == 0, nil
}

const (
	markerAbort  = 0
	markerCommit = 1
)

// markerType is a control record's type: its key is a version (int16)
// and a type (int16), 0 abort, 1 commit.
func markerType(r *kgo.Record) int {
	if len(r.Key) < 4 {
		return -1
	}
	return int(binary.BigEndian.Uint16(r.Key[2:4]))
}

func (w *VisibilityWatch) report(lastHeal time.Time) Visibility {
	var v Visibility
	type txn struct {
		pid   int64
		epoch int16
	}
	aborted := map[int32]map[int64]bool{}
	committed := map[int32]map[int64]bool{}
	onLog := map[int32]map[int64]time.Time{}
	pending := map[int32]map[int64][]int64{} // partition, producer ID: offsets awaiting a marker
	type onPartition struct {
		txn
		p int32
	}
	abortedTxns, committedTxns := map[onPartition]int{}, map[onPartition]int{}
	mark := func(m map[int32]map[int64]bool, p int32, off int64) {
		if m[p] == nil {
			m[p] = map[int64]bool{}
		}
		m[p][off] = true
	}
	for i, r := range w.ruRecs {
		if pending[r.Partition] == nil {
			pending[r.Partition] = map[int64][]int64{}
			onLog[r.Partition] = map[int64]time.Time{}
		}
		onLog[r.Partition][r.Offset] = w.ruAt[i]
		switch {
		case r.Attrs.IsControl():
			into, txns := committed, committedTxns
			if markerType(r) == markerAbort {
				into, txns = aborted, abortedTxns
			}
			txns[onPartition{txn{r.ProducerID, r.ProducerEpoch}, r.Partition}]++
			for _, off := range pending[r.Partition][r.ProducerID] {
				mark(into, r.Partition, off)
			}
			delete(pending[r.Partition], r.ProducerID)
		case r.Attrs.IsTransactional():
			v.Records++
			pending[r.Partition][r.ProducerID] = append(pending[r.Partition][r.ProducerID], r.Offset)
		default:
			v.Records++
			mark(committed, r.Partition, r.Offset)
		}
	}
	for _, byPID := range pending {
		for _, offs := range byPID {
			v.Open += len(offs)
		}
	}
	for p, offs := range committed {
		v.Committed += len(offs)
		for off := range offs {
			seen, ok := w.rcSeen[p][off]
			if !ok {
				v.MissedCommitted++
				continue
			}
			at := onLog[p][off]
			v.MaxInvisible = max(v.MaxInvisible, seen.Sub(at))
			if !lastHeal.IsZero() && !at.After(lastHeal) {
				v.AfterHeal = max(v.AfterHeal, seen.Sub(lastHeal))
			}
		}
	}
	for p, offs := range aborted {
		v.Aborted += len(offs)
		for off := range offs {
			if _, ok := w.rcSeen[p][off]; ok {
				v.AbortedReads++
			}
		}
	}
	count := func(m map[onPartition]int) int {
		most := map[txn]int{}
		for k, n := range m {
			most[k.txn] = max(most[k.txn], n)
		}
		total := 0
		for _, n := range most {
			total += n
		}
		return total
	}
	v.AbortedTxns, v.CommittedTxns, v.ReadCommitted = count(abortedTxns), count(committedTxns), w.rcRecs
	return v
}

func (w *VisibilityWatch) close() {
	w.cancel()
	w.done.Wait()
	w.ru.Close()
	w.rc.Close()
}
