// Package relaytest writes outbox rows the way the ledger's write path
// does, for the relay's tests and benchmarks: each row is inserted after its
// account's row lock is taken in the same transaction (the invariant the
// relay's ordering rests on), with the account's next revision. It also
// reads back what a relay delivered and checks it kept each account's
// order.
package relaytest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// Posted is one outbox row written by Post.
type Posted struct {
	EventID  string
	Account  string
	Revision int64
}

// Lock takes account's row lock (creating the account on first use) and
// returns its next revision, as the ledger store does. The row Insert
// writes has no journal line, where a posting reads an account's newest
// revision (account_revisions), so Lock also raises the account's floor to
// it, as a failover recovery does for revisions the ledger lacks.
func Lock(ctx context.Context, tx pgx.Tx, account string) (int64, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (id) VALUES ($1) ON CONFLICT DO NOTHING`, account); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, account); err != nil {
		return 0, err
	}
	var rev int64
	err := tx.QueryRow(ctx, `UPDATE accounts SET revision = (SELECT r.revision + 1 FROM account_revisions AS r WHERE r.id = $1)
WHERE id = $1 RETURNING revision`, account).Scan(&rev)
	return rev, err
}

// Insert writes account's outbox row at revision rev; call it after Lock in
// the same transaction. payload nil means a small JSON payload.
func Insert(ctx context.Context, tx pgx.Tx, account string, rev int64, payload []byte) (Posted, error) {
	id := uuid.Must(uuid.NewV7()).String()
	if payload == nil {
		payload = fmt.Appendf(nil, `{"event_id":%q,"account":%q,"revision":%d,"currency":"EUR","delta":"1"}`, id, account, rev)
	}
	_, err := tx.Exec(ctx, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
VALUES ($1, 'event', $2, $3, $4, $5, $6, $7, $8, now())`,
		id, core.TypeAccountPosted, core.TopicEvents, core.AggregateAccount, account, rev, core.ShardOf(account), payload)
	return Posted{EventID: id, Account: account, Revision: rev}, err
}

// Post writes one event per account (locks taken in sorted order, as the
// ledger store does to avoid deadlocks) in tx.
func Post(ctx context.Context, tx pgx.Tx, accounts ...string) ([]Posted, error) {
	accounts = slices.Sorted(slices.Values(accounts))
	var out []Posted
	for _, a := range accounts {
		rev, err := Lock(ctx, tx, a)
		if err != nil {
			return nil, err
		}
		p, err := Insert(ctx, tx, a, rev, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Commit commits one transaction with one event per account; a load
// generator moves on when it fails (a deadlock victim, say).
func Commit(ctx context.Context, pool *pgxpool.Pool, accounts ...string) ([]Posted, error) {
	var out []Posted
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		out, err = Post(ctx, tx, accounts...)
		return err
	})
	return out, err
}

// MustPost commits one transaction with one event per account.
func MustPost(t testing.TB, pool *pgxpool.Pool, accounts ...string) []Posted {
	t.Helper()
	out, err := Commit(context.Background(), pool, accounts...)
	if err != nil {
		t.Fatalf("post %v: %v", accounts, err)
	}
	return out
}

// MustPostN commits n transactions over the accounts acc-0 …
// acc-(accounts-1), the i-th (from 0) with one event on acc-(i mod
// accounts), and returns their events in commit order.
func MustPostN(t testing.TB, pool *pgxpool.Pool, n, accounts int) []Posted {
	t.Helper()
	var out []Posted
	for i := range n {
		out = append(out, MustPost(t, pool, fmt.Sprintf("acc-%d", i%accounts))...)
	}
	return out
}

// MustPostTransfers commits n transactions over the accounts acc-0 …
// acc-(accounts-1), the i-th (from 0) with one event on each of acc-(i mod
// accounts) and acc-((i+step) mod accounts), and returns their events in
// commit order.
func MustPostTransfers(t testing.TB, pool *pgxpool.Pool, n, accounts, step int) []Posted {
	t.Helper()
	var out []Posted
	for i := range n {
		out = append(out, MustPost(t, pool, fmt.Sprintf("acc-%d", i%accounts), fmt.Sprintf("acc-%d", (i+step)%accounts))...)
	}
	return out
}

// MustPostPayload commits one transaction with one event of account that
// carries payload instead of the small JSON one: a record the sink may
// refuse for its size.
func MustPostPayload(t testing.TB, pool *pgxpool.Pool, account string, payload []byte) Posted {
	t.Helper()
	ctx := context.Background()
	var p Posted
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rev, err := Lock(ctx, tx, account)
		if err != nil {
			return err
		}
		p, err = Insert(ctx, tx, account, rev, payload)
		return err
	})
	if err != nil {
		t.Fatalf("post %s: %v", account, err)
	}
	return p
}

// MustRollBack writes one event per account as Post does and rolls the
// transaction back: events that exist in no snapshot and must never reach
// a sink.
func MustRollBack(t testing.TB, pool *pgxpool.Pool, accounts ...string) []Posted {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := Post(ctx, tx, accounts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	return ps
}

// Fill writes perAccount events for each of n accounts (acc-<prefix>-<i>) in
// one INSERT … SELECT generate_series statement, revisions 1..perAccount,
// ids in revision order per account: a backlog for benchmarks.
func Fill(ctx context.Context, pool *pgxpool.Pool, prefix string, n, perAccount int) error {
	accounts := make([]string, n)
	shards := make([]int32, n)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("acc-%s-%d", prefix, i)
		shards[i] = int32(core.ShardOf(accounts[i]))
	}
	_, err := pool.Exec(ctx, `
WITH acc AS (
    INSERT INTO accounts (id, revision)
    SELECT a, $3 FROM unnest($1::text[]) AS a
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
SELECT gen_random_uuid(), 'event', $4, $5, $6, a.id, r, a.shard,
       convert_to(format('{"account":"%s","revision":%s,"currency":"EUR","delta":"1"}', a.id, r), 'UTF8'), now()
FROM unnest($1::text[], $2::int[]) AS a(id, shard)
CROSS JOIN generate_series(1, $3::int) AS r
ORDER BY r, a.id`, accounts, shards, perAccount, core.TypeAccountPosted, core.TopicEvents, core.AggregateAccount)
	return err
}

// Unrelayed counts outbox rows without a marker.
func Unrelayed(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_pending`).Scan(&n); err != nil {
		t.Fatalf("count unrelayed: %v", err)
	}
	return n
}

// AckTimes wraps a sink and records when it first ACKed each event ID: the
// far end of the commit-to-ACK latency the relay benchmarks report.
type AckTimes struct {
	core.Sink
	mu    sync.Mutex
	acked map[string]time.Time
}

// NewAckTimes wraps s.
func NewAckTimes(s core.Sink) *AckTimes {
	return &AckTimes{Sink: s, acked: map[string]time.Time{}}
}

// Publish publishes through the wrapped sink and, when it ACKs, records
// the time for each event ID not ACKed before.
func (s *AckTimes) Publish(ctx context.Context, batch []core.Envelope) error {
	err := s.Sink.Publish(ctx, batch)
	if err != nil {
		return err
	}
	s.Record(batch)
	return nil
}

// Record records now as the ACK time of each event ID in batch not ACKed
// before: for a sink whose ACK is another call than Publish (an
// exactly-once sink's PublishShard, say).
func (s *AckTimes) Record(batch []core.Envelope) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range batch {
		if _, ok := s.acked[e.EventID]; !ok {
			s.acked[e.EventID] = now
		}
	}
}

// Acked returns when the event ID was first ACKed, and whether it was.
func (s *AckTimes) Acked(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.acked[id]
	return at, ok
}

// WaitLatencies waits up to a minute until every event ID of committed
// (when each was committed) is ACKed and returns each one's commit-to-ACK
// latency, sorted; committed must no longer change.
func (s *AckTimes) WaitLatencies(tb testing.TB, committed map[string]time.Time) []time.Duration {
	tb.Helper()
	wait.For(tb, time.Minute, "every event ACKed", func() bool {
		for id := range committed {
			if _, ok := s.Acked(id); !ok {
				return false
			}
		}
		return true
	})
	lat := make([]time.Duration, 0, len(committed))
	for id, c := range committed {
		a, _ := s.Acked(id)
		lat = append(lat, max(a.Sub(c), 0))
	}
	slices.Sort(lat)
	return lat
}

// ApplyClock records when a consumer first and last applied events and
// how many its handler applied (a batch that then rolled back included:
// it only tells when to ask the inbox): the consumers' end of a
// benchmark's figures. Its methods are safe for concurrent use.
type ApplyClock struct {
	mu          sync.Mutex
	first, last time.Time
	applied     int
}

// Tick records that the handler applied events now.
func (c *ApplyClock) Tick(events int) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first.IsZero() {
		c.first = now
	}
	c.last = now
	c.applied += events
}

// Reached reports whether the handler applied events or more.
func (c *ApplyClock) Reached(events int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied >= events
}

// Span is the time from the first applied event to the last.
func (c *ApplyClock) Span() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.Sub(c.first)
}

// Delivered decodes the records sink holds on ledger.events, in the order
// they were published.
func Delivered(t testing.TB, sink *memory.Sink) []core.Envelope {
	t.Helper()
	return DeliveredOn(t, sink, core.TopicEvents)
}

// DeliveredOn decodes the records sink holds on topic, in the order they
// were published.
func DeliveredOn(t testing.TB, sink *memory.Sink, topic string) []core.Envelope {
	t.Helper()
	var out []core.Envelope
	for _, m := range sink.Records(topic) {
		e, err := core.EnvelopeFromMessage(m)
		if err != nil {
			t.Fatalf("delivered record: %v", err)
		}
		out = append(out, e)
	}
	return out
}

// CheckOrder fails on any revision that is not the account's next one;
// repeats of the last seen or earlier revisions are allowed when dups is
// true (at-least-once). It returns each account's last revision.
func CheckOrder(t testing.TB, got []core.Envelope, dups bool) map[string]int64 {
	t.Helper()
	last := map[string]int64{}
	for _, e := range got {
		switch {
		case e.Revision == last[e.AggregateID]+1:
			last[e.AggregateID] = e.Revision
		case dups && e.Revision <= last[e.AggregateID]:
		default:
			t.Fatalf("%s: revision %d delivered after %d", e.AggregateID, e.Revision, last[e.AggregateID])
		}
	}
	return last
}

// Relay is a relay of either mode as a test starts and stops it.
type Relay interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Start starts r, failing the test if it cannot, and stops it (softly,
// within 10 s) when the test ends.
func Start(t testing.TB, r Relay) {
	t.Helper()
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
}
