package faultkit

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// TestRelayReport reads a real ledger: a posting's unrelayed rows show on
// their shards, with the aggregates, and the tables the relays keep.
func TestRelayReport(t *testing.T) {
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	store := ledgerstore.New(pool, ledgerstore.Config{})
	if _, _, err := store.Post(ctx, "k1", core.Posting{Entries: []core.Entry{
		{Account: "report-a", Direction: core.Debit, Amount: 5, Currency: "EUR"},
		{Account: "report-b", Direction: core.Credit, Amount: 5, Currency: "EUR"},
	}}); err != nil {
		t.Fatal(err)
	}
	rep, err := (&System{Ledger: pool}).RelayReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(rep, "  shard "); n != core.Shards {
		t.Fatalf("%d shard lines, want %d:\n%s", n, core.Shards, rep)
	}
	for _, want := range []string{"report-a", "report-b", "owner -", "live relays: none", "parked aggregates: none"} {
		if !strings.Contains(rep, want) {
			t.Fatalf("report lacks %q:\n%s", want, rep)
		}
	}
	t.Logf("\n%s", rep)
}

// TestMissingReport: of two relayed events a consumer has not applied, the
// one the broker holds and the one it does not are told apart.
func TestMissingReport(t *testing.T) {
	_, ledger := pgtest.Ledger(t)
	_, consumer := pgtest.Consumer(t)
	ctx := context.Background()
	res, _, err := ledgerstore.New(ledger, ledgerstore.Config{}).Post(ctx, "k1", core.Posting{Entries: []core.Entry{
		{Account: "miss-a", Direction: core.Debit, Amount: 5, Currency: "EUR"},
		{Account: "miss-b", Direction: core.Credit, Amount: 5, Currency: "EUR"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.Exec(ctx, `DELETE FROM outbox_pending`); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, core.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	onBroker := res.Events[0].EventID
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: core.TopicEvents, Value: []byte("{}"),
		Headers: []kgo.RecordHeader{{Key: core.HeaderEventID, Value: []byte(onBroker)}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rep, err := (&System{Ledger: ledger, Consumer: consumer, BrokerAddr: cluster.ListenAddrs()[0]}).MissingReport(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("1 on the broker [%s (", onBroker)
	if !strings.Contains(rep, want) || !strings.Contains(rep, "1 not on the broker ["+res.Events[1].EventID) {
		t.Fatalf("report %q, want %q and the other event off the broker", rep, want)
	}
}
