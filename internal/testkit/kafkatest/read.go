package kafkatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadTopic reads topic from its start on the brokers at addrs and returns
// its records in the order received (per partition, offset order), as a
// read_committed reader when committed is set (records of aborted
// transactions are not returned), else as a read_uncommitted one. It stops
// once idle passes without a new record. The idle clock starts at the
// first record: on a loaded machine the first fetch (connection, metadata)
// can take longer than idle, and a read that stopped then would report a
// full topic as empty; a topic with nothing on it is waited for up to
// firstRecordWait.
func ReadTopic(ctx context.Context, addrs []string, topic string, committed bool, idle time.Duration) ([]*kgo.Record, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200 * time.Millisecond)}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("broker client: %w", err)
	}
	defer cl.Close()
	const firstRecordWait = 30 * time.Second
	var out []*kgo.Record
	start := time.Now()
	var last time.Time
	for last.IsZero() && time.Since(start) < max(firstRecordWait, idle) || !last.IsZero() && time.Since(last) < idle {
		pctx, cancel := context.WithTimeout(ctx, idle)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			last = time.Now()
		})
	}
	return out, nil
}

// MustReadTopic is ReadTopic for a test: it reads topic until 2 s pass
// without a new record, within a minute, and fails t on an error.
func MustReadTopic(t testing.TB, addrs []string, topic string, committed bool) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := ReadTopic(ctx, addrs, topic, committed, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// Header returns the value of r's header key ("" if it has none).
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
