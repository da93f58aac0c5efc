package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/exampletest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// TestWalletsEndToEndThroughRelayKills: four writers credit 12 wallets
// through the publish package while the relay (a real process) is
// SIGKILLed three times and restarted; the statement consumer, on
// Posthorn's Go middleware, ends with one line per credit, revisions 1..n
// in order, and every wallet's balance, although the kills made the relay
// send batches again.
func TestWalletsEndToEndThroughRelayKills(t *testing.T) {
	ctx := context.Background()
	path := exampletest.Start(t, Topic)
	svc := pgtest.Pool(t, path.LedgerURL, 8)
	cons := pgtest.Pool(t, path.ConsumerURL, 8)
	if err := Migrate(ctx, svc, cons); err != nil {
		t.Fatal(err)
	}
	stop, err := StartStatements(ctx, cons, path.Brokers)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const writers, perWriter = 4, 150
	path.KillRelayWhile(t, 3, func() {
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for i := range perWriter {
					if err := Credit(ctx, svc, fmt.Sprintf("w-%d", (w*7+i)%12), int64(100+i)); err != nil {
						t.Errorf("credit: %v", err)
						return
					}
					time.Sleep(25 * time.Millisecond) // pacing the load across the relay kills, not synchronisation
				}
			})
		}
		wg.Wait()
	})
	wait.ForStatus(t, 90*time.Second, "every credit applied once, in order", func() (bool, string) {
		err := Check(ctx, svc, cons)
		return err == nil, fmt.Sprint(err)
	})
	var applied, repeats int64
	if err := cons.QueryRow(ctx, `SELECT count(*) FILTER (WHERE disposition = 'applied'), coalesce(sum(duplicates), 0)
		FROM consumer_inbox WHERE consumer = $1`, Consumer).Scan(&applied, &repeats); err != nil {
		t.Fatal(err)
	}
	if applied != writers*perWriter {
		t.Fatalf("%d events applied, want %d", applied, writers*perWriter)
	}
	t.Logf("%d credits applied once each through %d relay kills; %d repeats absorbed by the inbox", applied, 3, repeats)
}
