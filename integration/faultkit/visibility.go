package faultkit

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka/kafkatest"
	"github.com/posthorn/posthorn/core"
)

// VisibilityWatch reads the event topic while a run goes on, with two
// franz-go readers of its own: read_uncommitted, keeping the transaction
// markers (control records), and read_committed. From what each received,
// and when, it tells which records belong to aborted transactions, whether
// the read_committed reader received any of them or missed a committed
// one, and how long each event the ledger marked relayed stayed invisible
// to it. It trusts nothing of the relay's: only the broker's records and
// markers, and the ledger's relayed_at.
type VisibilityWatch struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
	ru, rc *kgo.Client
	adm    *kadm.Client

	mu sync.Mutex
	// ruRecs are the read_uncommitted reader's records, markers included,
	// in the order received (per partition in offset order).
	ruRecs []*kgo.Record
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
			w.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) { w.ruRecs = append(w.ruRecs, r) })
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
	// AbortedTxns counts the distinct transactions (producer ID and
	// epoch) that ended with an abort marker; CommittedTxns those with a
	// commit marker.
	AbortedTxns, CommittedTxns int
	// ReadCommitted is what the read_committed reader received;
	// AbortedReads how many of those were records of aborted transactions;
	// MissedCommitted how many committed records it did not receive.
	ReadCommitted, AbortedReads, MissedCommitted int
	// MaxInvisible is the longest an event stayed invisible to the
	// read_committed reader after the ledger marked it relayed
	// (relayed_at); AfterHeal the longest an event marked before the last
	// heal stayed invisible after that heal; Marked counts the events
	// compared. Unseen counts marked events the reader never received.
	MaxInvisible, AfterHeal time.Duration
	Marked, Unseen          int
}

func (v Visibility) String() string {
	return fmt.Sprintf("read_uncommitted %d records (%d committed, %d aborted in %d transactions, %d open; %d committed transactions); read_committed %d records, %d aborted reads, %d committed missed; %d marked events: invisible at most %v after their marker, %v after the heal, %d never seen",
		v.Records, v.Committed, v.Aborted, v.AbortedTxns, v.Open, v.CommittedTxns, v.ReadCommitted, v.AbortedReads, v.MissedCommitted,
		v.Marked, v.MaxInvisible.Round(10*time.Millisecond), v.AfterHeal.Round(10*time.Millisecond), v.Unseen)
}

// Stop waits until both readers have read to the end of every partition
// (the read_committed one to the last stable offset, which an open
// transaction holds back: it waits up to wait for that), stops them and
// returns what they saw, held against the ledger's markers. lastHeal is
// the last fault's heal (zero: none).
func (w *VisibilityWatch) Stop(ctx context.Context, ledger *pgxpool.Pool, lastHeal time.Time, wait time.Duration) (Visibility, error) {
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
	relayedAt, err := relayedTimes(ctx, ledger)
	if err != nil {
		return Visibility{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.report(relayedAt, lastHeal), nil
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
	v := w.report(nil, time.Time{})
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

func (w *VisibilityWatch) report(relayedAt map[string]time.Time, lastHeal time.Time) Visibility {
	var v Visibility
	type txn struct {
		pid   int64
		epoch int16
	}
	aborted := map[int32]map[int64]bool{}
	committed := map[int32]map[int64]bool{}
	pending := map[int32]map[int64][]int64{} // partition, producer ID: offsets awaiting a marker
	abortedTxns, committedTxns := map[txn]bool{}, map[txn]bool{}
	mark := func(m map[int32]map[int64]bool, p int32, off int64) {
		if m[p] == nil {
			m[p] = map[int64]bool{}
		}
		m[p][off] = true
	}
	for _, r := range w.ruRecs {
		if pending[r.Partition] == nil {
			pending[r.Partition] = map[int64][]int64{}
		}
		switch {
		case r.Attrs.IsControl():
			into, txns := committed, committedTxns
			if markerType(r) == markerAbort {
				into, txns = aborted, abortedTxns
			}
			txns[txn{r.ProducerID, r.ProducerEpoch}] = true
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
			if _, ok := w.rcSeen[p][off]; !ok {
				v.MissedCommitted++
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
	v.AbortedTxns, v.CommittedTxns, v.ReadCommitted = len(abortedTxns), len(committedTxns), w.rcRecs
	for id, at := range relayedAt {
		v.Marked++
		seen, ok := w.rcFirst[id]
		if !ok {
			v.Unseen++
			continue
		}
		v.MaxInvisible = max(v.MaxInvisible, seen.Sub(at))
		if !lastHeal.IsZero() && !at.After(lastHeal) {
			v.AfterHeal = max(v.AfterHeal, seen.Sub(lastHeal))
		}
	}
	return v
}

// relayedTimes returns, per event of the topic marked relayed, when.
func relayedTimes(ctx context.Context, ledger *pgxpool.Pool) (map[string]time.Time, error) {
	rows, err := ledger.Query(ctx, `SELECT event_id::text, relayed_at FROM outbox WHERE topic = $1 AND relayed_at IS NOT NULL`, core.TopicEvents)
	if err != nil {
		return nil, fmt.Errorf("relayed events: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		out[id] = at
	}
	return out, rows.Err()
}

func (w *VisibilityWatch) close() {
	w.cancel()
	w.done.Wait()
	w.ru.Close()
	w.rc.Close()
}
