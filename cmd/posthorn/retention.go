package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/ops"
)

func runRetention(ctx context.Context, args []string) error {
	fs := newFlags("retention", "database.url", "consumer.database.url", "retention.batch_size", "retention.inbox_margin", "retention.idempotency_key_ttl")
	only := fs.String("only", "", "run only inbox or idempotency-keys retention (default: both that are configured)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	inbox, keys := true, true
	p, err := fs.start(ctx, args, needs{check: func(cfg *configs.Config) error {
		switch *only {
		case "":
			inbox, keys = cfg.Consumer.Database.URL != "", cfg.Database.URL != ""
			if !inbox && !keys {
				return errors.New("nothing to prune: set consumer.database.url (inbox) or database.url (idempotency keys)")
			}
		case "inbox":
			keys = false
		case "idempotency-keys":
			inbox = false
		default:
			return fmt.Errorf("--only %q: want inbox or idempotency-keys", *only)
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close()
	if inbox {
		if err := p.openConsumer(ctx); err != nil {
			return err
		}
	}
	if keys {
		if err := p.openLedger(ctx, 2); err != nil {
			return err
		}
	}
	cfg := p.cfg
	rc := retentionConfig(cfg, p.consumer, p.ledger)
	if inbox {
		rc.Consumers = exampleNames()
	}
	res, err := ops.Retain(ctx, rc)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	names := make([]string, 0, len(res.Inbox))
	for n := range res.Inbox {
		names = append(names, n)
	}
	sort.Strings(names)
	h := rc.InboxHorizon()
	for _, n := range names {
		fmt.Printf("inbox %s: deleted %d final rows in %d batches (ordered: below the applied revision and last touched before %s; unordered: before %s)\n",
			n, res.Inbox[n].Deleted, res.Inbox[n].Batches, h.Ordered.UTC().Format("2006-01-02T15:04:05Z"), h.Unordered.UTC().Format("2006-01-02T15:04:05Z"))
	}
	if res.IdempotencyKeys != nil {
		fmt.Printf("idempotency keys: deleted %d older than %s in %d batches\n", res.IdempotencyKeys.Deleted, cfg.Retention.IdempotencyKeyTTL, res.IdempotencyKeys.Batches)
	}
	return nil
}

// retentionConfig is ops.RetentionConfig from the configuration, over the
// given pools (nil: that part is skipped).
func retentionConfig(cfg configs.Config, consumerPool, ledgerPool *pgxpool.Pool) ops.RetentionConfig {
	rc := ops.RetentionConfig{
		ReplayWindow: cfg.Cleanup.ReplayWindow, Margin: cfg.Retention.InboxMargin,
		KeyTTL: cfg.Retention.IdempotencyKeyTTL, BatchSize: cfg.Retention.BatchSize,
	}
	if consumerPool != nil {
		rc.Inbox = inboxstore.New(consumerPool)
	}
	if ledgerPool != nil {
		rc.Ledger = opsstore.New(ledgerPool)
	}
	return rc
}

// startRetention runs retention every retention.interval in the background
// of a long-running command until ctx ends (the hook of `posthorn consume`
// for the inbox of its consumers, and of `posthorn api` for the
// idempotency keys).
func startRetention(ctx context.Context, cfg configs.Config, consumerPool, ledgerPool *pgxpool.Pool, consumerNames []string, log *slog.Logger) {
	if cfg.Retention.Interval <= 0 {
		return
	}
	rc := retentionConfig(cfg, consumerPool, ledgerPool)
	rc.Consumers = consumerNames
	go ops.RetainEvery(ctx, cfg.Retention.Interval, rc, log.With("component", "retention"))
}
