package delivery

import (
	"errors"
	"fmt"
	"time"

	"github.com/posthorn/posthorn/core"
)

// StuckTracker decides when a record that keeps failing retryably is stuck
// rather than unlucky, so that its aggregate is parked and the rest of the
// outbox stops paying for it with backoff.
//
// The sink must have shown that it works: an attempt counts against a
// record only once the sink took some other record since the record's
// first failure (in that batch or later), and never in a batch where the
// records of several aggregates all failed, which is what a broker-wide
// outage looks like. So an outage only backs off and never parks everyone,
// while a record that fails alone (after the others went through) keeps
// counting. An aggregate is parked once its failing record has counted
// attempts >= Attempts, or counted attempts spanning >= After (whichever
// comes first; a bound <= 0 is off), with the last error as reason.
//
// The price: during an outage that starts while only one aggregate has rows
// left, and that began right after the sink took others, that one
// aggregate can park; `posthorn outbox release` sends it again.
//
// A StuckTracker is not safe for concurrent use: it belongs to one relay
// loop.
type StuckTracker struct {
	attempts int
	after    time.Duration
	now      func() time.Time
	streaks  map[core.AggregateKey]*streak
	acked    int64 // records the sink took, ever
}

type streak struct {
	eventID string
	ackedAt int64 // StuckTracker.acked before the first failure's batch
	count   int
	first   time.Time // of the first counted attempt
	lastErr error
}

// maxStreaks bounds the tracker's memory when very many aggregates fail at
// once; past it, streaks start over (parking only comes later).
const maxStreaks = 100_000

// NewStuckTracker returns a tracker with the bounds attempts and after
// (<= 0: that bound is off; both off: never park for retryable failures,
// the earlier behaviour).
func NewStuckTracker(attempts int, after time.Duration) *StuckTracker {
	return &StuckTracker{attempts: attempts, after: after, now: time.Now, streaks: map[core.AggregateKey]*streak{}}
}

// Observe records the outcome s of publishing batch (the sink answered
// err) and returns the aggregates to park now.
func (t *StuckTracker) Observe(batch []core.Envelope, err error, s Settlement) []core.ParkedAggregate {
	if t == nil || (t.attempts <= 0 && t.after <= 0) {
		return nil
	}
	// Records ACKed now end their aggregate's streak; so does a park for good.
	for _, i := range s.Mark {
		e := batch[i]
		if st, ok := t.streaks[e.Aggregate()]; ok && st.eventID == e.EventID {
			delete(t.streaks, e.Aggregate())
		}
	}
	for _, p := range s.Parks {
		delete(t.streaks, p.Key())
	}
	base := t.acked
	t.acked += int64(s.Acked)
	if len(s.Retry) == 0 {
		return nil
	}
	perRecord := recordErrors(err)
	now := t.now()
	failing := map[core.AggregateKey]bool{}
	for _, i := range s.Retry {
		failing[batch[i].Aggregate()] = true
	}
	// Several aggregates and not one record taken: an outage, not a record.
	outage := s.Acked == 0 && len(failing) > 1
	var parks []core.ParkedAggregate
	seen := map[core.AggregateKey]bool{}
	for _, i := range s.Retry {
		e := batch[i]
		k := e.Aggregate()
		if seen[k] {
			continue // a later record of an aggregate whose first one failed
		}
		seen[k] = true
		ferr := perRecord[i]
		if ferr == nil {
			ferr = err
		}
		st := t.streaks[k]
		if st == nil || st.eventID != e.EventID {
			if len(t.streaks) >= maxStreaks {
				clear(t.streaks)
			}
			st = &streak{eventID: e.EventID, ackedAt: base}
			t.streaks[k] = st
		}
		st.lastErr = ferr
		if outage || t.acked == st.ackedAt {
			continue // no proof yet that the sink takes anything
		}
		if st.count == 0 {
			st.first = now
		}
		st.count++
		byCount := t.attempts > 0 && st.count >= t.attempts
		byTime := t.after > 0 && st.count >= 2 && now.Sub(st.first) >= t.after
		if !byCount && !byTime {
			continue
		}
		delete(t.streaks, k)
		parks = append(parks, core.ParkedAggregate{AggregateType: e.AggregateType, AggregateID: e.AggregateID, EventID: e.EventID,
			Reason: fmt.Sprintf("retryable failure for %d attempts over %s while the sink took other records (last error: %v)",
				st.count, now.Sub(st.first).Round(time.Millisecond), st.lastErr)})
	}
	return parks
}

// recordErrors returns a *core.BatchError's per-record failures (nil for
// any other error).
func recordErrors(err error) map[int]error {
	if be := (*core.BatchError)(nil); errors.As(err, &be) {
		return be.Failed
	}
	return nil
}
