package sqlsink_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/sqlsink"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
	"github.com/posthorn/posthorn/internal/testkit/sqltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the suite against a fresh database on the machine's
// Postgres. The outage refuses new connections to that database (ALLOW_CONNECTIONS
// false) and terminates its backends, as a server going away would.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		target := pgtest.NewDatabase(t)
		cfg := sqlsink.Config{URL: target, MaxPayloadBytes: 1 << 20}
		return sinktest.Harness{
			Sink:     sinktest.Open(t, sqlsink.New, cfg),
			Read:     readFunc(target),
			TooLarge: make([]byte, 2<<20),
			Outage:   func(t *testing.T) func() { return sqltest.Outage(t, target) },
		}
	})
}

// readFunc reads a topic's table in offset order, the order watermill-sql's
// subscriber reads one writer's rows in.
func readFunc(target string) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		c, err := pgx.Connect(ctx, target)
		if err != nil {
			return nil, err
		}
		defer c.Close(context.Background())
		table := sqlsink.Schema().MessagesTable(topic)
		for {
			var out []sinktest.Record
			rows, err := c.Query(ctx, `SELECT uuid, payload, metadata::text FROM `+table+` ORDER BY "offset"`)
			if err == nil {
				for rows.Next() {
					var id, md string
					var payload []byte
					if err := rows.Scan(&id, &payload, &md); err != nil {
						return nil, err
					}
					h := map[string]string{}
					if err := json.Unmarshal([]byte(md), &h); err != nil {
						return nil, err
					}
					if h["event_id"] != id {
						h["event_id"] = "uuid " + id + " != header " + h["event_id"]
					}
					out = append(out, sinktest.Record{Topic: topic, Headers: h, Payload: payload})
				}
				err = rows.Err()
			}
			if err == nil && len(out) >= n {
				return out, nil
			}
			select {
			case <-ctx.Done():
				return out, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
