package faultkit

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/core"
)

// BrokerEventIDs reads the whole event topic from the broker and returns
// the event IDs it holds (header event_id). It stops after idle passes
// without a new record. The marker-before-ACK control uses it to prove
// that events the relay marked never reached the broker.
func (s *System) BrokerEventIDs(ctx context.Context, idle time.Duration) (map[string]bool, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.BrokerAddr), kgo.ConsumeTopics(core.TopicEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("broker client: %w", err)
	}
	defer cl.Close()
	ids := map[string]bool{}
	last := time.Now()
	for time.Since(last) < idle {
		pctx, cancel := context.WithTimeout(ctx, idle)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == core.HeaderEventID {
					ids[string(h.Value)] = true
				}
			}
			last = time.Now()
		})
	}
	return ids, nil
}

// RelayedNotOnBroker returns the relayed (marked) events the broker does
// not hold: events lost between marker and send.
func (s *System) RelayedNotOnBroker(ctx context.Context) ([]string, error) {
	onBroker, err := s.BrokerEventIDs(ctx, 3*time.Second)
	if err != nil {
		return nil, err
	}
	rows, err := s.Ledger.Query(ctx, `SELECT o.event_id::text FROM outbox o WHERE o.topic = $1 AND `+postgres.Relayed, core.TopicEvents)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var lost []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if !onBroker[id] {
			lost = append(lost, id)
		}
	}
	return lost, rows.Err()
}
