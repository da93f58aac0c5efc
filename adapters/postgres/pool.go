package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrBadDSN is returned for a database URL that does not parse. Its message
// never contains the URL, which may hold a password.
var ErrBadDSN = errors.New("database URL does not parse")

// ParseConfig parses a DSN into a pool configuration without echoing it.
// Its connections give up on a server that stops answering
// (DefaultTCPUserTimeout, the URL's tcp_user_timeout).
func ParseConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors quote the DSN, password included: drop them.
		return nil, ErrBadDSN
	}
	if err := dialWithUserTimeout(&cfg.ConnConfig.Config); err != nil {
		return nil, err
	}
	return cfg, nil
}

// connectOnce opens one connection to dsn for a one-off task (what names
// it in the error, which gives host, port and database, never the URL).
func connectOnce(ctx context.Context, dsn, what string) (*pgx.Conn, error) {
	cfg, err := ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("%s: connect to %s:%d/%s: %w", what, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	return conn, nil
}

// Connect opens a pool of at least minConns connections (pgxpool's default
// follows the CPU count, 4 on a 2-core machine, and more writers than that
// would queue silently) and checks that the server answers.
func Connect(ctx context.Context, dsn string, minConns int32) (*pgxpool.Pool, error) {
	cfg, err := ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if cfg.MaxConns < minConns {
		cfg.MaxConns = minConns
	}
	return ConnectConfig(ctx, cfg)
}

// ConnectConfig opens a pool with cfg (from ParseConfig) and checks that the
// server answers. Its errors name host, port and database, never the
// password.
func ConnectConfig(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s:%d/%s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s:%d/%s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}
