package main

import (
	"context"
	"fmt"

	"github.com/posthorn/posthorn/adapters/postgres"
)

func init() {
	register(command{name: "migrate", summary: "create or upgrade the ledger schema (--consumer, --roles)", run: runMigrate})
}

func runMigrate(ctx context.Context, args []string) error {
	fs, path := flagSet("migrate")
	consumer := fs.Bool("consumer", false, "migrate the example consumers' schema on consumer.database.url")
	keyFlags(fs, "database.url", "consumer.database.url")
	cfg, err := loadConfig(fs, path, args)
	if err != nil {
		return err
	}
	if *consumer {
		if err := cfg.RequireConsumerDatabase(); err != nil {
			return err
		}
		if err := postgres.Migrate(ctx, cfg.Consumer.Database.URL, postgres.ConsumerSchema); err != nil {
			return err
		}
		fmt.Println("consumer schema is up to date")
		return nil
	}
	if err := cfg.RequireDatabase(); err != nil {
		return err
	}
	if err := postgres.Migrate(ctx, cfg.Database.URL, postgres.LedgerSchema); err != nil {
		return err
	}
	fmt.Println("ledger schema is up to date")
	return nil
}
