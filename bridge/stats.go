package bridge

import (
	"context"
	"time"
)

// StatsWait is how long a relay waits before it reads its gauges again:
// interval, or, when reading them took longer than a tenth of that, ten
// times as long as it took. The backlog query reads every pending row
// (about a second of database time per million), and at the default 2 s it
// slowed the drain of a 1M backlog by a quarter to a third.
func StatsWait(interval, took time.Duration) time.Duration { return max(interval, 10*took) }

// refreshStats updates the backlog, parked and open-transaction gauges,
// waiting StatsWait between reads.
func (r *Relay) refreshStats(ctx context.Context) {
	t := time.NewTimer(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		began := time.Now()
		st, err := r.store.Status(ctx)
		if err == nil {
			r.m.backlog.Set(float64(st.Backlog))
			r.m.oldestAge.Set(st.OldestUnrelayedAge)
			r.m.parked.Set(float64(len(st.Parked)))
		} else if ctx.Err() == nil {
			r.log.Warn("outbox status", "err", err)
		}
		if age, err := r.store.OldestOpenTransactionAge(ctx); err == nil {
			r.m.heldByOpenTx.Set(age.Seconds())
		}
		t.Reset(StatsWait(r.cfg.StatsInterval, time.Since(began)))
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
