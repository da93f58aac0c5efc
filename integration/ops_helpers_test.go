package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
	"github.com/posthorn/posthorn/relay/polling"
)

// opsRig is a ledger, the memory sink as the broker, and the two example
// consumers reading it: the real pieces, end to end.
type opsRig struct {
	ledger   *pgxpool.Pool
	consumer *pgxpool.Pool
	store    *ledgerstore.Store
	ops      *opsstore.Store
	sink     *memory.Sink
	posted   []core.PostingResult
	n        int
	// cdc relays in CDC mode (the ledger's server needs wal_level=logical).
	cdc bool
}

// startOpsConsumers runs the two example consumers (consumers.Registry,
// the real middleware) on the memory sink until the test ends. The
// consumer scenario helpers are built for gochannel and kfake; the memory
// sink's subscriber plugs straight into the registry.
//
// opts apply to both consumers (WithoutInbox for negative controls).
func startOpsConsumers(t *testing.T, sink *memory.Sink, pool *pgxpool.Pool, opts ...consumers.Option) {
	t.Helper()
	reg := newRegistry(t, pool, 10*time.Second, consumers.Config{
		Subscribers: func(string) (message.Subscriber, error) { return sink.Subscriber(), nil },
	})
	if err := projection.Register(reg, core.TopicEvents, opts...); err != nil {
		t.Fatal(err)
	}
	if err := auditlog.Register(reg, core.TopicEvents, opts...); err != nil {
		t.Fatal(err)
	}
	runRegistry(t, reg, t.Errorf)
}

const opsWait = 60 * time.Second

func newOpsRig(t *testing.T) *opsRig {
	t.Helper()
	_, ledger := pgtest.Ledger(t)
	consumer := smallConsumerPool(t)
	sink := memory.New(memory.Config{})
	t.Cleanup(func() { _ = sink.Close() })
	r := &opsRig{ledger: ledger, consumer: consumer, store: ledgerstore.New(ledger, ledgerstore.Config{}),
		ops: opsstore.New(ledger), sink: sink}
	startOpsConsumers(t, sink, consumer)
	return r
}

var opsAccounts = []string{"acc-alice", "acc-bob", "acc-carol", "acc-dave", "acc-erin"}

// post writes n postings (two lines each; every fifth has a command) and
// returns how many events they made.
func (r *opsRig) post(t *testing.T, n int) int {
	t.Helper()
	events := 0
	for range n {
		i := r.n
		r.n++
		a, b := opsAccounts[i%len(opsAccounts)], opsAccounts[(i+1+i/len(opsAccounts))%len(opsAccounts)]
		if a == b {
			b = opsAccounts[(i+2)%len(opsAccounts)]
		}
		p := core.Posting{Entries: []core.Entry{
			{Account: a, Direction: core.Debit, Amount: int64(100 + i), Currency: "EUR"},
			{Account: b, Direction: core.Credit, Amount: int64(100 + i), Currency: "EUR"},
		}}
		if i%5 == 0 {
			p.Commands = []core.CommandSpec{{Type: "payouts.payout.execute", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}}
		}
		res, _, err := r.store.Post(context.Background(), fmt.Sprintf("ops-%d", i), p)
		if err != nil {
			t.Fatal(err)
		}
		r.posted = append(r.posted, res)
		events += len(res.Events)
	}
	return events
}

// relay runs the polling relay until the outbox has no unrelayed row, then stops it.
func (r *opsRig) relay(t *testing.T, hooks *polling.Hooks) *polling.Relay {
	t.Helper()
	if r.cdc {
		r.relayCDC(t)
		return nil
	}
	rel := startRelay(t, r.ledger, r.sink, relay.Settings{
		Owner: fmt.Sprintf("ops-relay-%d", time.Now().UnixNano()), BatchSize: 200, LeaseTTL: time.Second,
		PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, hooks)
	if hooks == nil {
		wait.For(t, 60*time.Second, "outbox relayed", func() bool { return relaytest.Unrelayed(t, r.ledger) == 0 })
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rel.Stop(stopCtx); err != nil {
			t.Fatal(err)
		}
	}
	return rel
}

// relayCDC runs a CDC relay (slot "ops") until the outbox is relayed,
// then stops it; the slot stays for the next run.
func (r *opsRig) relayCDC(t *testing.T) {
	t.Helper()
	rel, err := cdc.New(relaystore.New(r.ledger), cdcsource.New(r.ledger), r.sink, relay.Settings{
		Owner: fmt.Sprintf("ops-cdc-%d", time.Now().UnixNano()), SinkName: "memory", LeaseTTL: 2 * time.Second,
		RetryInitial: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CDC: relay.CDC{Slot: "ops", StatusInterval: 200 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rel.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "outbox relayed in CDC mode", func() bool { return relaytest.Unrelayed(t, r.ledger) == 0 })
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rel.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
}

// deliver posts n postings, relays them and waits until both consumers
// applied their events, and returns how many there were.
func (r *opsRig) deliver(t *testing.T, n int) int {
	t.Helper()
	events := r.post(t, n)
	r.relay(t, nil)
	r.waitApplied(t, events)
	return events
}

// waitApplied waits until both example consumers applied events events.
func (r *opsRig) waitApplied(t *testing.T, events int) {
	t.Helper()
	wait.For(t, opsWait, fmt.Sprintf("both consumers applied %d events", events), func() bool {
		p, a := counts(t, r.consumer, projection.Name), counts(t, r.consumer, auditlog.Name)
		return p.Events[core.DispositionApplied] == int64(events) && a.Events[core.DispositionApplied] == int64(events)
	})
}

// waitDuplicates waits until each consumer absorbed n repeats in total.
func (r *opsRig) waitDuplicates(t *testing.T, n int64) {
	t.Helper()
	wait.For(t, opsWait, fmt.Sprintf("both consumers absorbed %d repeats", n), func() bool {
		p, a := counts(t, r.consumer, projection.Name), counts(t, r.consumer, auditlog.Name)
		return p.DuplicatesAbsorbed == n && a.DuplicatesAbsorbed == n
	})
}

func (r *opsRig) sources() []ops.ConsumerSource {
	in := inboxstore.New(r.consumer)
	return []ops.ConsumerSource{
		{Name: projection.Name, Reader: ops.InboxReader{Inbox: in, Consumer: projection.Name}},
		{Name: auditlog.Name, Reader: ops.InboxReader{Inbox: in, Consumer: auditlog.Name}},
	}
}

func (r *opsRig) reconcile(t *testing.T, archive ops.ArchiveStore) ops.Report {
	t.Helper()
	rep, err := ops.Reconcile(context.Background(), ops.ReconcileConfig{Ledger: r.ops, Consumers: r.sources(), Archive: archive, Record: true})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// ledgerBalances reads the ledger's non-zero balances as the projection
// keeps them.
func (r *opsRig) ledgerBalances(t *testing.T) map[string]map[string]*big.Int {
	t.Helper()
	out := map[string]map[string]*big.Int{}
	for acc, curs := range ledgerBalances(t, r.ledger) {
		out[acc] = map[string]*big.Int{}
		for cur, bal := range curs {
			out[acc][cur] = big.NewInt(bal)
		}
	}
	return nonZero(out)
}

func (r *opsRig) projected(t *testing.T) map[string]map[string]*big.Int {
	t.Helper()
	bs, err := projection.Balances(context.Background(), r.consumer)
	if err != nil {
		t.Fatal(err)
	}
	return nonZero(bs)
}

// assertBalancesMatch checks that the projection equals the ledger.
func (r *opsRig) assertBalancesMatch(t *testing.T) {
	t.Helper()
	l, p := r.ledgerBalances(t), r.projected(t)
	if len(l) == 0 || fmt.Sprint(l) != fmt.Sprint(p) {
		t.Fatalf("projection differs from the ledger:\nprojection %v\nledger     %v", p, l)
	}
}

func (r *opsRig) count(t *testing.T, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := r.ledger.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func mustExec(t *testing.T, pool *pgxpool.Pool, q string, args ...any) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if tag.RowsAffected() == 0 {
		t.Fatalf("%s: no row changed: the tampering did nothing", q)
	}
}
