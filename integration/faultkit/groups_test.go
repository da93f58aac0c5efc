package faultkit

import (
	"context"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/pgtest"
	"github.com/posthorn/posthorn/core"
)

// TestRelayReport reads a real ledger: a posting's unrelayed rows show on
// their shards, with the aggregates, and the tables the relays keep.
func TestRelayReport(t *testing.T) {
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	store := postgres.NewLedgerStore(pool, postgres.LedgerConfig{})
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
