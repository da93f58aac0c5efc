package main

import (
	"context"
	"os"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/api"
)

func init() {
	register(command{name: "api", summary: "serve the Posting API", run: runAPI})
}

// apiConns is the pool size: requests beyond it queue for a connection,
// and pgxpool's CPU-based default (4 here) would queue far too early.
const apiConns = 32

func runAPI(ctx context.Context, args []string) error {
	fs, path := flagSet("api")
	keyFlags(fs, "database.url", "api.listen")
	cfg, err := loadConfig(fs, path, args)
	if err != nil {
		return err
	}
	if err := cfg.RequireDatabase(); err != nil {
		return err
	}
	tlsCfg, err := cfg.API.TLS.Load() // nil without api.tls.cert_file
	if err != nil {
		return err
	}
	logger := newLogger(cfg.Log, os.Stderr)
	pool, err := postgres.Connect(ctx, cfg.Database.URL, apiConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	postgres.WarnIfSuperuser(ctx, pool, logger, "api", postgres.RoleAPI)
	startRetention(ctx, cfg, nil, pool, nil, logger) // issue 14: idempotency-key retention on retention.interval
	store := postgres.NewLedgerStore(pool, postgres.LedgerConfig{CommandTopicPrefix: cfg.Sink.CommandTopicPrefix,
		MetadataAllowlist: cfg.Outbox.MetadataAllowlist, MetadataMaxBytes: cfg.Outbox.MetadataMaxBytes})
	srv, err := api.New(api.Config{Listen: cfg.API.Listen, Tokens: cfg.API.Tokens, TLS: tlsCfg, Logger: logger}, store)
	if err != nil {
		return err
	}
	// Returns nil once SIGINT or SIGTERM cancelled ctx and in-flight
	// requests finished: the command exits 0.
	return srv.ListenAndServe(ctx)
}
