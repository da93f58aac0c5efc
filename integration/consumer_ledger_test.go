package integration

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/sync/errgroup"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// The projection's balances equal the ledger's after a few thousand
// postings: posted through ledgerstore.Store by concurrent writers, their outbox
// envelopes published to gochannel (which delivers them concurrently, so
// out of order), a tenth of them twice.
func TestConsumerProjectionMatchesLedger(t *testing.T) {
	t.Parallel()
	const postings, writers = 2000, 8
	_, ledgerPool := pgtest.Ledger(t)
	consumerPool := smallConsumerPool(t)
	ctx := context.Background()
	store := ledgerstore.New(ledgerPool, ledgerstore.Config{})

	accounts := make([]string, 25)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("acc-%02d", i)
	}
	currencies := []string{"EUR", "USD", "JPY"}
	var posters errgroup.Group
	for w := range writers {
		posters.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for i := w; i < postings; i += writers {
				cur := currencies[rng.IntN(len(currencies))]
				a, b := rng.IntN(len(accounts)), rng.IntN(len(accounts)-1)
				if b >= a {
					b++
				}
				amount := int64(1 + rng.IntN(100000))
				p := core.Posting{Entries: []core.Entry{
					{Account: accounts[a], Direction: core.Debit, Amount: amount, Currency: cur},
					{Account: accounts[b], Direction: core.Credit, Amount: amount, Currency: cur},
				}}
				if i%5 == 0 { // a three-line posting now and then
					c := (b + 1) % len(accounts)
					if c == a {
						c = (c + 1) % len(accounts)
					}
					p.Entries[1].Amount = amount / 2
					p.Entries = append(p.Entries, core.Entry{Account: accounts[c], Direction: core.Credit, Amount: amount - amount/2, Currency: cur})
					if amount/2 == 0 {
						p.Entries = p.Entries[:2]
						p.Entries[1].Amount = amount
					}
				}
				if _, _, err := store.Post(ctx, fmt.Sprintf("k-%d", i), p); err != nil {
					return fmt.Errorf("posting %d: %w", i, err)
				}
			}
			return nil
		})
	}
	if err := posters.Wait(); err != nil {
		t.Fatal(err)
	}

	shards := make([]int, core.Shards)
	for i := range shards {
		shards[i] = i
	}
	rows, err := relaystore.New(ledgerPool).ReadBatch(ctx, shards, 1_000_000, core.OrderByID)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*message.Message
	events := 0
	for i, r := range rows {
		if r.Envelope.Kind != core.KindEvent {
			continue
		}
		events++
		msgs = append(msgs, r.Envelope.ToMessage())
		if i%10 == 0 {
			msgs = append(msgs, r.Envelope.ToMessage()) // a resend
		}
	}
	if events < 2*postings {
		t.Fatalf("%d events in the outbox for %d postings", events, postings)
	}

	tr := gochannelTransport(t)
	rig := startConsumer(t, tr, consumerPool, rigOptions{audit: true})
	start := time.Now()
	tr.publish(t, msgs...)
	wait.ForStatus(t, 3*time.Minute, "every outbox event applied", func() (bool, string) {
		p, a := counts(t, consumerPool, projection.Name), counts(t, consumerPool, auditlog.Name)
		return p.Events[core.DispositionApplied] == int64(events) && a.Events[core.DispositionApplied] == int64(events),
			fmt.Sprintf("projection %+v, audit %+v", p, a)
	})
	p := counts(t, consumerPool, projection.Name)
	t.Logf("%d postings, %d events (+%d resends) applied in %s; projection duplicates absorbed %d, events held for a gap %v",
		postings, events, len(msgs)-events, time.Since(start).Round(time.Millisecond), p.DuplicatesAbsorbed,
		promtest.Value(t, rig.prom, "posthorn_consumer_revision_gaps_total", "consumer", projection.Name))
	if p.DuplicatesAbsorbed != int64(len(msgs)-events) || p.ParkedAggregates != 0 {
		t.Fatalf("projection counts %+v, want %d duplicates and no parks", p, len(msgs)-events)
	}

	ledger := map[string]map[string]*big.Int{}
	lrows, err := ledgerPool.Query(ctx, `SELECT account_id, currency, balance FROM account_balances`)
	if err != nil {
		t.Fatal(err)
	}
	for lrows.Next() {
		var acc, cur string
		var bal int64
		if err := lrows.Scan(&acc, &cur, &bal); err != nil {
			t.Fatal(err)
		}
		if bal == 0 {
			continue
		}
		if ledger[acc] == nil {
			ledger[acc] = map[string]*big.Int{}
		}
		ledger[acc][cur] = big.NewInt(bal)
	}
	if err := lrows.Err(); err != nil {
		t.Fatal(err)
	}
	proj, err := projection.Balances(ctx, consumerPool)
	if err != nil {
		t.Fatal(err)
	}
	for acc, curs := range proj { // zero balances may exist on either side
		for cur, v := range curs {
			if v.Sign() == 0 {
				delete(curs, cur)
			}
		}
		if len(curs) == 0 {
			delete(proj, acc)
		}
	}
	if fmt.Sprint(proj) != fmt.Sprint(ledger) {
		t.Fatalf("projection balances differ from the ledger's:\nprojection %v\nledger     %v", proj, ledger)
	}
	if len(ledger) == 0 {
		t.Fatal("the ledger has no balances: the comparison proves nothing")
	}
}
