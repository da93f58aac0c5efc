package main

import (
	"context"
	"crypto/tls"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/configs"
)

// apiConns is the pool size: requests beyond it queue for a connection,
// and pgxpool's CPU-based default (4 here) would queue far too early.
const apiConns = 32

func runAPI(ctx context.Context, args []string) error {
	fs := newFlags("api", "database.url", "api.listen")
	var tlsCfg *tls.Config
	p, err := fs.start(ctx, args, needs{ledger: apiConns, history: true, check: func(cfg *configs.Config) (err error) {
		tlsCfg, err = cfg.API.TLS.Load() // nil without api.tls.cert_file
		return err
	}})
	if err != nil {
		return err
	}
	defer p.close()
	postgres.WarnIfSuperuser(ctx, p.ledger, p.log, "api", postgres.RoleAPI)
	startRetention(ctx, p.cfg, nil, p.ledger, nil, p.log) // idempotency-key retention on retention.interval
	srv, err := api.New(api.Config{Listen: p.cfg.API.Listen, Tokens: p.cfg.API.Tokens, TLS: tlsCfg, Logger: p.log, TracerProvider: p.tracer,
		History: p.history}, ledgerStore(p.cfg, p.ledger, p.history))
	if err != nil {
		return err
	}
	// Returns nil once SIGINT or SIGTERM cancelled ctx and in-flight
	// requests finished: the command exits 0.
	return srv.ListenAndServe(ctx)
}

// ledgerStore is the Posting API's store on pool, as configured (the demo's
// API uses it too).
func ledgerStore(cfg configs.Config, pool *pgxpool.Pool, history *postgres.HistoryWatch) *ledgerstore.Store {
	return ledgerstore.New(pool, ledgerstore.Config{CommandTopicPrefix: cfg.Sink.CommandTopicPrefix,
		MetadataAllowlist: cfg.Outbox.MetadataAllowlist, MetadataMaxBytes: cfg.Outbox.MetadataMaxBytes, History: history})
}
