package demo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/core"
)

// Progress is a cheap snapshot of delivery: counts only, no comparison of
// IDs (Verify does that).
type Progress struct {
	// Events is the number of committed events on the event topic,
	// Unrelayed how many of them have no relay marker yet.
	Events    int64
	Unrelayed int64
	// Applied is, per consumer, the number of events it applied.
	Applied map[string]int64
}

// Delivered reports whether every committed event is relayed and applied
// by every consumer.
func (p Progress) Delivered() bool {
	if p.Unrelayed != 0 {
		return false
	}
	for _, a := range p.Applied {
		if a < p.Events {
			return false
		}
	}
	return true
}

// Lag is the largest number of relayed events a consumer has not applied
// yet, plus the unrelayed backlog.
func (p Progress) Lag() int64 {
	var worst int64
	for _, a := range p.Applied {
		worst = max(worst, p.Events-a)
	}
	return max(worst, p.Unrelayed)
}

// ReadProgress counts the ledger's events and backlog and each consumer's
// applied events.
func ReadProgress(ctx context.Context, ledger, consumer *pgxpool.Pool, consumers []string) (Progress, error) {
	p := Progress{Applied: make(map[string]int64, len(consumers))}
	if err := ledger.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT `+opsstore.Relayed+`) FROM outbox o WHERE o.topic = $1`,
		core.TopicEvents).Scan(&p.Events, &p.Unrelayed); err != nil {
		return p, fmt.Errorf("progress: outbox: %w", err)
	}
	for _, c := range consumers {
		var n int64
		if err := consumer.QueryRow(ctx, `SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND disposition = 'applied' AND aggregate_type = $2`,
			c, core.AggregateAccount).Scan(&n); err != nil {
			return p, fmt.Errorf("progress: inbox of %s: %w", c, err)
		}
		p.Applied[c] = n
	}
	return p, nil
}
