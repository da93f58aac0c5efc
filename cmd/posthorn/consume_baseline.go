package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/projection"
)

// runBaseline starts the balance projection at a cut of the ledger instead
// of at revision 0 (docs/consumers.md, "A new consumer mid-history").
func runBaseline(ctx context.Context, args []string) error {
	fs := newFlags("consume baseline", "database.url", "consumer.database.url")
	consumer := fs.String("consumer", projection.Name, "the consumer to start at the cut: only "+projection.Name+", whose state the ledger's balances are")
	asJSON := fs.Bool("json", false, "print one JSON object")
	p, err := fs.start(ctx, args, needs{ledger: 2, consumer: true, check: func(*configs.Config) error {
		if *consumer != projection.Name {
			return fmt.Errorf("--consumer %q: only %s can start from the ledger's balances; another consumer writes its own snapshot and calls inboxstore.Inbox.SetPositions in the same transaction", *consumer, projection.Name)
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close()
	cut, err := ledgerstore.ReadBalancesAtCut(ctx, p.ledger)
	if err != nil {
		return err
	}
	inbox := inboxstore.New(p.consumer)
	if err := pgx.BeginFunc(ctx, p.consumer, func(tx pgx.Tx) error {
		return projection.Baseline(ctx, tx, inbox, *consumer, cut)
	}); err != nil {
		return err
	}
	var events int64
	for _, rev := range cut.Revisions {
		events += rev
	}
	out := struct {
		Consumer string `json:"consumer"`
		Accounts int    `json:"accounts"`
		Balances int    `json:"balances"`
		Events   int64  `json:"events_at_cut"`
	}{*consumer, len(cut.Revisions), len(cut.Balances), events}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(out)
	}
	fmt.Printf("%s starts at the cut: %d accounts, %d balances, %d events already in them; it applies only later revisions\n",
		out.Consumer, out.Accounts, out.Balances, out.Events)
	return nil
}
