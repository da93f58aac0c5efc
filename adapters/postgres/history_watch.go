package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// ErrHistoryNotAccepted is core.ErrHistoryNotAccepted, which
// HistoryWatch.Check wraps.
var ErrHistoryNotAccepted = core.ErrHistoryNotAccepted

// historyRecheck is how often Check reads the history again while it is
// not accepted, so that an operator's acceptance is noticed within it.
const historyRecheck = time.Second

// HistoryWatch knows whether the ledger runs on the accepted history. It
// reads it on every new connection of the pools it watches, before the
// connection is used: a failover breaks every connection to the old
// primary, so the first one to the new primary reads the new history.
// While the history is not accepted, Check reads it again (at most every
// historyRecheck) and lets everything go on once an operator accepted it.
// A read that fails counts as not accepted. Safe for concurrent use.
type HistoryWatch struct {
	mu      sync.Mutex
	history core.LedgerHistory
	err     error
	read    bool
	readAt  time.Time
	recheck *pgxpool.Pool
}

// NewHistoryWatch returns a watch that has read nothing yet (Check then
// reads through the pool given to Recheck).
func NewHistoryWatch() *HistoryWatch { return &HistoryWatch{} }

// Watch makes every connection a pool configured with cfg opens read the
// history first (it keeps any AfterConnect already set).
func (w *HistoryWatch) Watch(cfg *pgxpool.Config) {
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, c); err != nil {
				return err
			}
		}
		h, err := ReadHistory(ctx, c)
		w.set(h, err)
		return nil
	}
}

// Recheck is the pool Check reads the history through while it is not
// accepted (one of the watched pools).
func (w *HistoryWatch) Recheck(pool *pgxpool.Pool) {
	w.mu.Lock()
	w.recheck = pool
	w.mu.Unlock()
}

func (w *HistoryWatch) set(h core.LedgerHistory, err error) {
	w.mu.Lock()
	w.history, w.err, w.read, w.readAt = h, err, true, time.Now()
	w.mu.Unlock()
}

// Check returns nil while the ledger runs on the accepted history, and
// otherwise an error wrapping ErrHistoryNotAccepted that names both
// histories (or the read's error).
func (w *HistoryWatch) Check(ctx context.Context) error {
	w.mu.Lock()
	ok := w.read && w.err == nil && w.history.Accepted
	stale := !w.read || time.Since(w.readAt) >= historyRecheck
	pool := w.recheck
	w.mu.Unlock()
	if ok {
		return nil
	}
	if stale && pool != nil {
		h, err := ReadHistory(ctx, pool)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.set(h, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.read:
		return fmt.Errorf("%w (not read yet)", ErrHistoryNotAccepted)
	case w.err != nil:
		return fmt.Errorf("%w (%v)", ErrHistoryNotAccepted, w.err)
	case !w.history.Accepted:
		return fmt.Errorf("%w: %s", ErrHistoryNotAccepted, w.history)
	}
	return nil
}

// QueryRower is what ReadHistory needs: a pool or a connection.
type QueryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadHistory reads the server's history and the one accepted last.
func ReadHistory(ctx context.Context, q QueryRower) (core.LedgerHistory, error) {
	var h core.LedgerHistory
	err := q.QueryRow(ctx, `SELECT accepted, system_identifier, timeline,
    coalesce(accepted_system_identifier, 0), coalesce(accepted_timeline, 0) FROM posthorn.ledger_history_accepted()`).
		Scan(&h.Accepted, &h.SystemIdentifier, &h.Timeline, &h.AcceptedSystemIdentifier, &h.AcceptedTimeline)
	if err != nil {
		return h, fmt.Errorf("read the ledger's history: %w", err)
	}
	return h, nil
}
