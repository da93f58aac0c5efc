package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
)

// startConsole serves the operator console (--console) over the demo's
// databases and sink until stop is called.
func (d *demoRun) startConsole(ctx context.Context) (stop func(), err error) {
	cfg := d.cfg
	cfg.Database.URL, cfg.Consumer.Database.URL = d.ledgerURL, d.consumerURL
	var sink core.Sink
	if d.mem != nil {
		sink = decorateSink(keepOpen{d.mem}, d.cfg.Sink, d.tracer)
	} else if sink, err = openSink(cfg.Sink, d.tracer); err != nil {
		return nil, err
	}
	// A pool of its own: the demo's checks keep theirs.
	pool, err := postgres.Connect(ctx, d.ledgerURL, 4)
	if err != nil {
		sink.Close()
		return nil, err
	}
	c, closeConsole, err := openConsole(ctx, cfg, pool, sink, nil, d.log)
	if err != nil {
		pool.Close()
		sink.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Console.Listen)
	if err != nil {
		closeConsole()
		pool.Close()
		sink.Close()
		return nil, fmt.Errorf("config key console.listen: %w", err)
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- c.Serve(cctx, ln) }()
	// On stderr whatever the log level: the demo logs at warn by default.
	fmt.Fprintf(os.Stderr, "operator console: http://%s/ (read-only unless console.token is set)\n", ln.Addr())
	return func() {
		cancel()
		if err := <-done; err != nil {
			d.log.Warn("operator console", "err", err)
		}
		closeConsole()
		pool.Close()
		sink.Close()
	}, nil
}

// databases sets up the ledger and consumer databases: the configured ones,
// or a throwaway cluster with one database of each. cleanup is always
// safe to call and removes the cluster.
func (d *demoRun) databases(ctx context.Context) (cleanup func(), err error) {
	var cluster *pgcluster.Cluster
	cleanup = func() {
		if d.ledger != nil {
			d.ledger.Close()
		}
		if d.consumer != nil {
			d.consumer.Close()
		}
		if cluster != nil {
			if err := cluster.Stop(); err != nil {
				d.log.Warn("removing the throwaway PostgreSQL cluster", "err", err)
			}
		}
	}
	d.ledgerURL, d.consumerURL = d.cfg.Database.URL, d.cfg.Consumer.Database.URL
	switch {
	case d.ledgerURL == "":
		if d.consumerURL != "" {
			return cleanup, errors.New("config key database.url: set it too when consumer.database.url is set, or unset both for a throwaway PostgreSQL")
		}
		if !d.json {
			fmt.Fprintln(os.Stderr, "starting a throwaway PostgreSQL (database.url is unset)…")
		}
		cluster, err = pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return cleanup, fmt.Errorf("database.url is unset, so the demo starts a throwaway PostgreSQL: %w", err)
		}
		d.log.Info("throwaway PostgreSQL started", "dir", cluster.Dir(), "port", cluster.Port())
		admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
		if err != nil {
			return cleanup, fmt.Errorf("throwaway PostgreSQL: %w", err)
		}
		for _, db := range []string{"posthorn_ledger", "posthorn_consumer"} {
			if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
				admin.Close(ctx)
				return cleanup, fmt.Errorf("throwaway PostgreSQL: create %s: %w", db, err)
			}
		}
		admin.Close(ctx)
		d.ledgerURL, d.consumerURL = cluster.URL("posthorn_ledger"), cluster.URL("posthorn_consumer")
	case d.consumerURL == "":
		return cleanup, errors.New("config key consumer.database.url: required when database.url is set (the consumers' own database)")
	default:
		// Configured databases: the demo posts random transfers and cuts
		// its relay short, so it runs only where nothing lives yet.
		if err := refuseLiveData(ctx, "database.url", d.ledgerURL); err != nil {
			return cleanup, err
		}
		if err := refuseLiveData(ctx, "consumer.database.url", d.consumerURL); err != nil {
			return cleanup, err
		}
	}
	d.throwaway = cluster != nil
	if err := postgres.Migrate(ctx, d.ledgerURL, postgres.LedgerSchema); err != nil {
		return cleanup, fmt.Errorf("migrate the ledger schema: %w", err)
	}
	if err := migrateConsumerDatabase(ctx, d.consumerURL, nil); err != nil {
		return cleanup, fmt.Errorf("migrate the consumer database: %w", err)
	}
	if d.ledger, err = postgres.Connect(ctx, d.ledgerURL, 2); err != nil {
		return cleanup, err
	}
	if d.consumer, err = postgres.Connect(ctx, d.consumerURL, 2); err != nil {
		return cleanup, err
	}
	d.cfg.Database.URL, d.cfg.Consumer.Database.URL = d.ledgerURL, d.consumerURL
	d.apiURL, d.relayURL = d.ledgerURL, d.ledgerURL
	if cluster != nil {
		// The demo owns the cluster: the API, the relay and the consumers
		// run under their own least-privilege roles, as in production.
		if d.apiURL, d.relayURL, d.cfg.Consumer.Database.URL, err = postgres.ComponentLogins(ctx, d.ledgerURL, d.consumerURL, "posthorn_demo", exampleNames()); err != nil {
			return cleanup, fmt.Errorf("per-component roles: %w", err)
		}
	}
	return cleanup, nil
}

// keepOpen shares the demo's memory broker with successive relays: a
// stopped relay closes its sink, which must not close the broker.
type keepOpen struct{ core.Sink }

func (keepOpen) Close() error { return nil }

// demoDataTables are the tables whose rows mean a database is in use: the
// ledger's postings and outbox, the consumers' inbox.
var demoDataTables = []string{"journals", "outbox", "consumer_inbox"}

// refuseLiveData returns an error naming key when its database already
// holds rows in demoDataTables, before the demo migrates or writes
// anything there.
func refuseLiveData(ctx context.Context, key, url string) error {
	conn, err := postgres.Connect(ctx, url, 1)
	if err != nil {
		return fmt.Errorf("config key %s: %w", key, err)
	}
	defer conn.Close()
	for _, table := range demoDataTables {
		var present, rows bool
		if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&present); err != nil {
			return fmt.Errorf("config key %s: %w", key, err)
		}
		if !present {
			continue
		}
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{table}.Sanitize()+`)`).Scan(&rows); err != nil {
			return fmt.Errorf("config key %s: %w", key, err)
		}
		if rows {
			return fmt.Errorf("config key %s: its database already holds %s rows; the demo writes random transfers, so it runs only on empty databases: "+
				"point database.url and consumer.database.url at new ones, or unset both for a throwaway PostgreSQL", key, table)
		}
	}
	return nil
}
