package projection_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

func TestHandleSumsDeltasPerCurrencyAndRefusesBadPayloadsForGood(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Consumer(t)
	ctx := context.Background()
	apply := func(rev int64, p core.AccountPosted, typ string) error {
		payload, _ := json.Marshal(p)
		e := core.Envelope{EventID: "e", Kind: core.KindEvent, Type: typ, AggregateType: core.AggregateAccount,
			AggregateID: "acc", Revision: rev, Payload: payload}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return projection.Handle(ctx, tx, e) })
	}
	for rev, d := range []struct{ cur, delta string }{{"EUR", "-1250"}, {"EUR", "250"}, {"USD", "7"}} {
		if err := apply(int64(rev+1), core.AccountPosted{Account: "acc", Revision: int64(rev + 1), Currency: d.cur, Delta: d.delta}, core.TypeAccountPosted); err != nil {
			t.Fatal(err)
		}
	}
	// Other event types pass without effect.
	if err := apply(4, core.AccountPosted{}, "ledger.account.renamed"); err != nil {
		t.Fatal(err)
	}
	b, err := projection.Balances(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if b["acc"]["EUR"].Int64() != -1000 || b["acc"]["USD"].Int64() != 7 {
		t.Fatalf("balances %v", b)
	}
	for name, p := range map[string]core.AccountPosted{
		"bad delta":      {Account: "acc", Revision: 5, Currency: "EUR", Delta: "1.5"},
		"other account":  {Account: "bob", Revision: 5, Currency: "EUR", Delta: "1"},
		"other revision": {Account: "acc", Revision: 9, Currency: "EUR", Delta: "1"},
		"no currency":    {Account: "acc", Revision: 5, Delta: "1"},
	} {
		if err := apply(5, p, core.TypeAccountPosted); !core.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent error", name, err)
		}
	}
}
