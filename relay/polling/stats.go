package polling

import (
	"context"
	"time"

	"github.com/posthorn/posthorn/relay/internal/relaymetrics"
)

// refreshStats updates the backlog, parked, horizon and open-transaction gauges,
// waiting StatsWait between reads.
func (r *Relay) refreshStats(ctx context.Context) {
	t := time.NewTimer(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		began := time.Now()
		st, err := r.store.Status(ctx)
		if err == nil {
			r.m.SetStatus(st)
		} else if ctx.Err() == nil {
			r.log.Warn("outbox status", "err", err)
		}
		if age, err := r.store.OldestOpenTransactionAge(ctx); err == nil {
			r.m.HeldByOpenTx.Set(age.Seconds())
		}
		t.Reset(relaymetrics.StatsWait(r.cfg.StatsInterval, time.Since(began)))
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
