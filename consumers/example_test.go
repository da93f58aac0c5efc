package consumers_test

import (
	"context"
	"errors"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
)

// A team registers its handler with a consumer name; the registry adds the
// inbox, gap check, retries and metrics. The handler writes its effect
// through tx only: the inbox row commits with it.
func ExampleRegistry() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://consumer@127.0.0.1:5432/consumer") // migrated with ConsumerSchema
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	var sub message.Subscriber // e.g. kafkagroup.Subscriber(brokers, "invoices", logger)
	reg, err := consumers.New(router, consumers.Config{
		Pool:        pool,
		Inbox:       inboxstore.New(pool),
		Subscribers: func(string) (message.Subscriber, error) { return sub, nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	// An event consumer whose effect depends on the previous revision.
	err = reg.AddEventHandler("invoices", core.TopicEvents, func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		_, err := tx.Exec(ctx, `UPDATE invoice_totals SET total = total + 1 WHERE account = $1`, e.AggregateID)
		return err
	}, consumers.DependsOnPredecessor())
	if err != nil {
		log.Fatal(err)
	}
	// The one owner of the payouts commands.
	err = reg.AddCommandHandler("payouts", "commands.payouts", func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		if !validPayout(e.Payload) {
			return consumers.Permanent(errBadPayout) // parked as poison, not retried
		}
		_, err := tx.Exec(ctx, `INSERT INTO payouts_requested (event_id) VALUES ($1)`, e.EventID)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = reg.Run(ctx) // until ctx is cancelled
}

var errBadPayout = errors.New("payout without a beneficiary")

func validPayout([]byte) bool { return true }
