package faultkit

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
)

// BrokerEventIDs reads the whole event topic from the broker and returns
// the event IDs it holds (header event_id). It stops after idle passes
// without a new record. The marker-before-ACK control uses it to prove
// that events the relay marked never reached the broker.
func (s *System) BrokerEventIDs(ctx context.Context, idle time.Duration) (map[string]bool, error) {
	return EventIDsOnBroker(ctx, s.BrokerAddr, idle)
}

// EventIDsOnBroker reads the whole event topic of the broker at addr and
// returns the event IDs it holds, stopping after idle without a new record
// (counted from the first record).
func EventIDsOnBroker(ctx context.Context, addr string, idle time.Duration) (map[string]bool, error) {
	recs, err := kafkatest.ReadTopic(ctx, []string{addr}, core.TopicEvents, false, idle)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, r := range recs {
		if id := kafkatest.Header(r, core.HeaderEventID); id != "" {
			ids[id] = true
		}
	}
	return ids, nil
}

// RelayedNotOnBroker returns the relayed (marked) events the broker does
// not hold: events lost between marker and send.
func (s *System) RelayedNotOnBroker(ctx context.Context) ([]string, error) {
	return RelayedNotOnBroker(ctx, s.Ledger, s.BrokerAddr)
}

// RelayedNotOnBroker returns the events of ledger that are marked relayed
// but that the broker at addr does not hold.
func RelayedNotOnBroker(ctx context.Context, ledger *pgxpool.Pool, addr string) ([]string, error) {
	onBroker, err := EventIDsOnBroker(ctx, addr, 3*time.Second)
	if err != nil {
		return nil, err
	}
	rows, err := ledger.Query(ctx, `SELECT o.event_id::text FROM outbox o WHERE o.topic = $1 AND `+opsstore.Relayed, core.TopicEvents)
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

// MissingReport names the relayed events consumer has not applied and
// tells, for each kind, whether the broker holds them: events on the broker
// that a group has committed past were lost by the consumer, events not on
// it by the relay or the broker. It lists their inbox dispositions too.
func (s *System) MissingReport(ctx context.Context, consumer string) (string, error) {
	rows, err := s.Ledger.Query(ctx, `SELECT o.event_id::text, o.aggregate_id, o.revision FROM outbox o WHERE o.topic = $1 AND `+opsstore.Relayed, core.TopicEvents)
	if err != nil {
		return "", fmt.Errorf("relayed events: %w", err)
	}
	relayed := map[string]string{}
	for rows.Next() {
		var id, agg string
		var rev int64
		if err := rows.Scan(&id, &agg, &rev); err != nil {
			rows.Close()
			return "", err
		}
		relayed[id] = fmt.Sprintf("%s r%d", agg, rev)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	rows, err = s.Consumer.Query(ctx, `SELECT event_id::text, disposition FROM consumer_inbox WHERE consumer = $1`, consumer)
	if err != nil {
		return "", fmt.Errorf("inbox of %s: %w", consumer, err)
	}
	disposition := map[string]string{}
	for rows.Next() {
		var id, d string
		if err := rows.Scan(&id, &d); err != nil {
			rows.Close()
			return "", err
		}
		disposition[id] = d
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	onBroker, err := s.BrokerEventIDs(ctx, 3*time.Second)
	if err != nil {
		return "", err
	}
	var on, off []string
	for id, what := range relayed {
		if disposition[id] == "applied" {
			continue
		}
		line := fmt.Sprintf("%s (%s, inbox: %s)", id, what, cmp.Or(disposition[id], "none"))
		if onBroker[id] {
			on = append(on, line)
		} else {
			off = append(off, line)
		}
	}
	sort.Strings(on)
	sort.Strings(off)
	return fmt.Sprintf("  relayed events %s has not applied: %d on the broker %v; %d not on the broker %v\n",
		consumer, len(on), on[:min(len(on), 5)], len(off), off[:min(len(off), 5)]), nil
}
