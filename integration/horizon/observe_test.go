package horizon_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// reader reads the topics from their start and keeps, per event ID, when
// the event occurred (its occurred_at header, written in the publishing
// transaction) and its latency: the record's timestamp, which the relay's
// producer sets when it hands the record over, minus that. The timestamp
// has a millisecond's resolution, so a latency is exact to about 1 ms.
type reader struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	seen    map[string]sample
	repeats int
	bad     []string // records without a usable event_id or occurred_at
}

type sample struct {
	occurred time.Time
	lat      time.Duration
}

func newReader(b *testing.B, brokers []string, topics ...string) *reader {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &reader{cl: cl, cancel: cancel, done: make(chan struct{}), seen: map[string]sample{}}
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			r.mu.Lock()
			fs.EachRecord(func(rec *kgo.Record) {
				var id, at string
				for _, h := range rec.Headers {
					switch h.Key {
					case core.HeaderEventID:
						id = string(h.Value)
					case core.HeaderOccurredAt:
						at = string(h.Value)
					}
				}
				occurred, err := time.Parse(time.RFC3339Nano, at)
				switch _, seen := r.seen[id]; {
				case id == "" || err != nil:
					r.bad = append(r.bad, fmt.Sprintf("%s/%d@%d: event_id %q, occurred_at %q", rec.Topic, rec.Partition, rec.Offset, id, at))
				case seen:
					r.repeats++
				default:
					r.seen[id] = sample{occurred: occurred, lat: max(rec.Timestamp.Sub(occurred), 0)}
				}
			})
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *reader) close() {
	r.cancel()
	<-r.done
	r.cl.Close()
}

// waitFor waits until every one of ids has been read, within d.
func (r *reader) waitFor(b *testing.B, what string, ids []string, d time.Duration) {
	pending := slices.Clone(ids)
	wait.ForStatus(b, d, what+": every committed event readable on the topic", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.bad) > 0 {
			b.Fatalf("%s: %d records without a usable event_id or occurred_at header, e.g. %s", what, len(r.bad), r.bad[0])
		}
		pending = slices.DeleteFunc(pending, func(id string) bool { _, ok := r.seen[id]; return ok })
		if len(pending) == 0 {
			return true, ""
		}
		return false, fmt.Sprintf("%d of %d events not read yet (e.g. %s)", len(pending), len(ids), pending[0])
	})
}

// samples returns what was read, keyed by event ID.
func (r *reader) samples() (map[string]sample, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen, r.repeats
}

func createTopics(b *testing.B, brokers []string, partitions int32, topics ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	res, err := kadm.NewClient(cl).CreateTopics(context.Background(), partitions, 1, nil, topics...)
	if err != nil {
		b.Fatal(err)
	}
	for _, t := range res.Sorted() {
		if t.Err != nil && !errors.Is(t.Err, kerr.TopicAlreadyExists) {
			b.Fatalf("create topic %s: %v", t.Topic, t.Err)
		}
	}
}

// dbStats is what the sampler reads at the end of each window: the queue's
// dead entries, the relay's statements on the queue since the last reset
// of pg_stat_statements, and the CPU the relay and the database's
// backends used so far.
type dbStats struct {
	dead              int64
	read, gauge, mark stmtStats
	relayCPU          float64
	dbCPU             map[int]float64
}

// stmtStats sums pg_stat_statements' rows of one statement (there may be
// several: a statement is one entry per query text and role).
type stmtStats struct {
	calls   int64
	totalMS float64
	buffers int64 // shared blocks hit and read
}

// meanMS and perCall are 0 for a statement that did not run.
func (s stmtStats) meanMS() float64 { return s.totalMS / float64(max(s.calls, 1)) }
func (s stmtStats) perCall() float64 {
	return float64(s.buffers) / float64(max(s.calls, 1))
}

// The relay's statements on the work queue, the same text in both
// designs: the polling relay's read of a batch (a range scan of
// outbox_pending per shard, selecting the outbox row's columns), the
// backlog gauge both modes refresh every few seconds (a count of the
// queue per shard), and the marker (a delete of a batch's entries, in both
// modes).
const (
	readPattern  = `%SELECT o.id, o.shard, o.event_id::text%FROM outbox_pending p%`
	gaugePattern = `%count(*) AS n, min(o.created_at) AS oldest%FROM outbox_pending p%`
	markPattern  = `%DELETE FROM outbox_pending%`
)

func readStats(b *testing.B, probe *pgxpool.Pool, relayPid int) dbStats {
	ctx := context.Background()
	var s dbStats
	if err := probe.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox_pending'), 0)`).Scan(&s.dead); err != nil {
		b.Fatal(err)
	}
	for _, st := range []struct {
		pattern string
		into    *stmtStats
	}{{readPattern, &s.read}, {gaugePattern, &s.gauge}, {markPattern, &s.mark}} {
		if err := probe.QueryRow(ctx, `
SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8,
       coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE $1`, st.pattern).
			Scan(&st.into.calls, &st.into.totalMS, &st.into.buffers); err != nil {
			b.Fatal(err)
		}
	}
	s.relayCPU, _ = pgtest.ProcessCPU(relayPid)
	s.dbCPU = pgtest.BackendCPU(b, probe, `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()`)
	return s
}

func resetStatements(b *testing.B, probe *pgxpool.Pool) {
	if _, err := probe.Exec(context.Background(), `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}
}
