package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/consolestore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/console"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// runConsole serves the operator console (docs/console.md) until SIGINT or
// SIGTERM.
func runConsole(ctx context.Context, args []string) error {
	fs := newFlags("console", "database.url", "consumer.database.url", "console.listen", "console.token",
		"archive.dir", "sink.kind", "sink.kafka.brokers")
	listen := fs.String("listen", "", "address to serve on, host:port (default: config key console.listen, "+configs.ConsoleListenDefault+")")
	p, err := fs.start(ctx, args, needs{ledger: 4, archive: true, sink: true, check: func(cfg *configs.Config) error {
		if *listen != "" {
			cfg.Console.Listen = *listen
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("--listen: %w", err)
			}
		}
		if err := cfg.RequireDatabase(); err != nil {
			return err
		}
		_, err := reconcileConsumers(*cfg)
		return err
	}})
	if err != nil {
		return err
	}
	defer p.close()
	c, closeConsole, err := openConsole(ctx, p.cfg, p.ledger, p.sink, p.archive, p.log)
	if err != nil {
		return err
	}
	defer closeConsole()
	return serveConsole(ctx, c, p.cfg.Console.Listen, p.log)
}

// openConsole builds the console over the ledger pool: the consumers of
// reconcileConsumers read through read-only pools, as `posthorn reconcile`
// reads them, and consumer-side releases go to consumer.database.url, as
// `posthorn consume release` does. close closes the pools it opened.
func openConsole(ctx context.Context, cfg configs.Config, ledger *pgxpool.Pool, sink core.Sink, archive ops.ArchiveStore, log *slog.Logger) (*console.Console, func(), error) {
	list, err := reconcileConsumers(cfg)
	if err != nil {
		return nil, nil, err
	}
	pools := readOnlyPools{}
	var release *pgxpool.Pool
	closeAll := func() {
		pools.close()
		if release != nil {
			release.Close()
		}
	}
	inboxes := map[string]*pgxpool.Pool{}
	var sources []ops.ConsumerSource
	for _, rc := range list {
		pool, err := pools.of(ctx, rc)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		inboxes[rc.Name] = pool
		src, err := consumerSource(rc, pool)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		sources = append(sources, src)
	}
	if cfg.Consumer.Database.URL != "" {
		if release, err = postgres.Connect(ctx, cfg.Consumer.Database.URL, 2); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("config key consumer.database.url: %w", err)
		}
	}
	c, err := console.New(console.Config{
		Store: consolestore.New(consolestore.Config{Ledger: ledger, Slot: cfg.Relay.CDC.Slot,
			Inboxes: inboxes, Release: release}),
		Ledger:       opsstore.New(ledger),
		Consumers:    sources,
		Archive:      archive,
		Required:     requiredConsumers(cfg),
		ReplayWindow: cfg.Cleanup.ReplayWindow,
		Sink:         sink,
		Token:        cfg.Console.Token,
		Operators:    cfg.Console.Operators,
		RelayMode:    cfg.Relay.Mode,
		Logger:       log,
	})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return c, closeAll, nil
}

// serveConsole serves c on addr until ctx ends. The log says where, and
// whether actions are on; never the token.
func serveConsole(ctx context.Context, c *console.Console, addr string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("config key console.listen: %w", err)
	}
	return serveConsoleOn(ctx, c, ln, log)
}

// serveConsoleOn is serveConsole on a listener of the caller's.
func serveConsoleOn(ctx context.Context, c *console.Console, ln net.Listener, log *slog.Logger) error {
	if c.ReadOnly() {
		log.Info("operator console is read-only: console.token is not set", "url", "http://"+ln.Addr().String()+"/")
	} else {
		log.Info("operator console listening; actions need console.token or an operator token (console.operators)", "url", "http://"+ln.Addr().String()+"/")
	}
	if !c.ReadOnly() && !c.NamesOperators() {
		log.Warn("console.token is shared: the audit log names operators by what they type; set console.operators to name them by their own tokens")
	}
	return c.Serve(ctx, ln)
}
