package pgtest_test

import (
	"context"
	"testing"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

func TestLedger(t *testing.T) {
	_, p := pgtest.Ledger(t)
	var n int
	if err := p.QueryRow(context.Background(), "select count(*) from outbox").Scan(&n); err != nil {
		t.Fatal(err)
	}
	_, p2 := pgtest.Consumer(t)
	_ = p2
}
