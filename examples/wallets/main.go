// Command wallets is a team's own service, not the ledger: it keeps wallet
// balances in its own table and publishes a wallet.credited event in the
// same transaction as each credit, through the publish package. A consumer
// built on Posthorn's Go middleware (the inbox) keeps each wallet's
// statement in another database, every credit once and in order.
//
// Run it against a Posthorn setup (README.md in this folder): it credits
// -credits times across -wallets wallets, waits until the statements have
// caught up, checks them against the balances and exits non-zero on any
// difference.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/publish"
)

// Topic is where the wallets' events go (publish: events.<aggregate type>).
const Topic = "events.wallet"

// Consumer is the statement consumer's name (its inbox rows and group).
const Consumer = "wallet-statements"

func main() {
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/posthorn?sslmode=disable", "the service's database, migrated with posthorn migrate (the outbox lives there)")
	consumerDB := flag.String("consumer-db", "postgres://postgres@127.0.0.1:5432/posthorn_consumers?sslmode=disable", "the consumer's database, migrated with posthorn migrate --consumer")
	broker := flag.String("broker", "127.0.0.1:9092", "a Kafka broker the relay publishes to")
	credits := flag.Int("credits", 1000, "credits to make")
	wallets := flag.Int("wallets", 20, "wallets to credit")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *db, *consumerDB, *broker, *credits, *wallets); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, db, consumerDB, broker string, credits, wallets int) error {
	svc, err := pgxpool.New(ctx, db)
	if err != nil {
		return err
	}
	defer svc.Close()
	cons, err := pgxpool.New(ctx, consumerDB)
	if err != nil {
		return err
	}
	defer cons.Close()
	if err := Migrate(ctx, svc, cons); err != nil {
		return err
	}
	stopConsumer, err := StartStatements(ctx, cons, []string{broker})
	if err != nil {
		return err
	}
	defer stopConsumer()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for range credits {
		if err := Credit(ctx, svc, fmt.Sprintf("w-%d", rng.IntN(wallets)), int64(1+rng.IntN(10000))); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := Check(ctx, svc, cons)
		if err == nil {
			fmt.Printf("wallets: %d credits published and applied once, in order per wallet\n", credits)
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Migrate creates the service's table next to the outbox, and the
// consumer's statements next to its inbox.
func Migrate(ctx context.Context, svc, cons *pgxpool.Pool) error {
	if _, err := svc.Exec(ctx, `CREATE TABLE IF NOT EXISTS wallets (
		id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`); err != nil {
		return fmt.Errorf("wallets table: %w", err)
	}
	_, err := cons.Exec(ctx, `CREATE TABLE IF NOT EXISTS wallet_statements (
		wallet text NOT NULL, revision bigint NOT NULL, amount bigint NOT NULL, balance bigint NOT NULL,
		event_id text NOT NULL UNIQUE, PRIMARY KEY (wallet, revision))`)
	if err != nil {
		return fmt.Errorf("wallet_statements table: %w", err)
	}
	return nil
}

// Credited is the wallet.credited payload.
type Credited struct {
	Wallet  string `json:"wallet"`
	Amount  int64  `json:"amount"`
	Balance int64  `json:"balance"`
}

// Credit adds amount to wallet and publishes wallet.credited in the same
// transaction: both commit, or neither.
func Credit(ctx context.Context, svc *pgxpool.Pool, wallet string, amount int64) error {
	return pgx.BeginFunc(ctx, svc, func(tx pgx.Tx) error {
		var balance int64
		if err := tx.QueryRow(ctx, `INSERT INTO wallets (id, balance) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET balance = wallets.balance + EXCLUDED.balance
			RETURNING balance`, wallet, amount).Scan(&balance); err != nil {
			return err
		}
		payload, err := json.Marshal(Credited{Wallet: wallet, Amount: amount, Balance: balance})
		if err != nil {
			return err
		}
		_, err = publish.Pgx(tx).Event(ctx, publish.Message{AggregateType: "wallet", AggregateID: wallet,
			Type: "wallet.credited", Payload: payload})
		return err
	})
}

// applyCredit writes one statement line in the inbox's transaction. It
// depends on its predecessor (the running balance): the inbox gives it
// each wallet's events once, in revision order.
func applyCredit(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
	var c Credited
	if err := json.Unmarshal(e.Payload, &c); err != nil {
		return consumers.Permanent(fmt.Errorf("payload of %s: %w", e.EventID, err))
	}
	var prev int64
	err := tx.QueryRow(ctx, `SELECT balance FROM wallet_statements WHERE wallet = $1 AND revision = $2`, e.AggregateID, e.Revision-1).Scan(&prev)
	if errors.Is(err, pgx.ErrNoRows) && e.Revision == 1 {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("wallet %s revision %d: previous line: %w", e.AggregateID, e.Revision, err)
	}
	if prev+c.Amount != c.Balance {
		return consumers.Permanent(fmt.Errorf("wallet %s revision %d: %d + %d is not the service's balance %d", e.AggregateID, e.Revision, prev, c.Amount, c.Balance))
	}
	_, err = tx.Exec(ctx, `INSERT INTO wallet_statements (wallet, revision, amount, balance, event_id) VALUES ($1, $2, $3, $4, $5)`,
		e.AggregateID, e.Revision, c.Amount, c.Balance, e.EventID)
	return err
}

// StartStatements runs the statement consumer on brokers until the
// returned stop is called.
func StartStatements(ctx context.Context, cons *pgxpool.Pool, brokerAddrs []string) (stop func(), err error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	reg, err := consumers.New(router, consumers.Config{
		Pool: cons, Inbox: inboxstore.New(cons),
		Subscribers: func(name string) (message.Subscriber, error) {
			return kafkagroup.Subscriber(brokerAddrs, name, watermill.NopLogger{})
		},
	})
	if err != nil {
		return nil, err
	}
	if err := reg.AddEventHandler(Consumer, Topic, applyCredit, consumers.DependsOnPredecessor()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			log.Printf("wallet statements stopped: %v", err)
		}
	}, nil
}

// Check compares the statements with the service's balances: every wallet
// has one line per credit with revisions 1..n, and its last line's balance
// is the wallet's.
func Check(ctx context.Context, svc, cons *pgxpool.Pool) error {
	rows, err := svc.Query(ctx, `SELECT w.id, w.balance, (SELECT count(*) FROM outbox o WHERE o.aggregate_type = 'wallet' AND o.aggregate_id = w.id)
		FROM wallets w ORDER BY w.id`)
	if err != nil {
		return err
	}
	type want struct{ balance, credits int64 }
	wallets := map[string]want{}
	for rows.Next() {
		var id string
		var w want
		if err := rows.Scan(&id, &w.balance, &w.credits); err != nil {
			return err
		}
		wallets[id] = w
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(wallets) == 0 {
		return errors.New("no wallets")
	}
	for id, w := range wallets {
		var lines, maxRev, balance int64
		if err := cons.QueryRow(ctx, `SELECT count(*), coalesce(max(revision), 0),
			coalesce((SELECT balance FROM wallet_statements WHERE wallet = $1 ORDER BY revision DESC LIMIT 1), 0)
			FROM wallet_statements WHERE wallet = $1`, id).Scan(&lines, &maxRev, &balance); err != nil {
			return err
		}
		if lines != w.credits || maxRev != w.credits || balance != w.balance {
			return fmt.Errorf("wallet %s: %d statement lines up to revision %d, balance %d; the service made %d credits, balance %d",
				id, lines, maxRev, balance, w.credits, w.balance)
		}
	}
	return nil
}
