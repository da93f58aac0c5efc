package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// RetentionConfig configures PruneInboxes and PruneIdempotencyKeys.
type RetentionConfig struct {
	// Inbox is the consumers' inbox; nil skips inbox retention.
	Inbox Inbox
	// Consumers are the consumers whose inbox rows are pruned.
	Consumers []string
	// Ledger is the ledger; nil skips idempotency-key retention.
	Ledger RetentionStore
	// ReplayWindow is cleanup.replay_window: a replay may resend events this
	// old, so an unordered consumer keeps its rows for it plus Margin.
	ReplayWindow time.Duration
	// Margin is retention.inbox_margin: how long any final row stays at
	// least (and the slack past the replay window).
	Margin time.Duration
	// KeyTTL is retention.idempotency_key_ttl: how long the Posting API
	// recognises an Idempotency-Key.
	KeyTTL time.Duration
	// BatchSize is the most rows deleted per statement (default 1000).
	BatchSize int
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// RetentionResult is what one run removed.
type RetentionResult struct {
	Inbox           map[string]PruneResult `json:"inbox,omitempty"`
	IdempotencyKeys *PruneResult           `json:"idempotency_keys,omitempty"`
}

func (c *RetentionConfig) defaults() {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// InboxHorizon is the safe horizon of the inbox: an ordered consumer's
// final rows go once they are below the aggregate's applied revision (a
// repeat is recognised by revision) and older than Margin; an unordered
// consumer's once they are older than the replay window plus Margin (no
// replay resends them; an older replay would be applied again).
func (c RetentionConfig) InboxHorizon() InboxHorizon {
	c.defaults()
	now := c.Now()
	return InboxHorizon{Ordered: now.Add(-c.Margin), Unordered: now.Add(-(c.ReplayWindow + c.Margin))}
}

// Retain runs inbox retention for every consumer (when Inbox is set) and
// idempotency-key retention (when Ledger is set).
func Retain(ctx context.Context, cfg RetentionConfig) (RetentionResult, error) {
	cfg.defaults()
	var res RetentionResult
	if cfg.Inbox != nil {
		res.Inbox = map[string]PruneResult{}
		h := cfg.InboxHorizon()
		for _, name := range cfg.Consumers {
			r, err := cfg.Inbox.PruneInbox(ctx, name, h, cfg.BatchSize)
			res.Inbox[name] = r
			if err != nil {
				return res, err
			}
		}
	}
	if cfg.Ledger != nil {
		if cfg.KeyTTL <= 0 {
			return res, errors.New("retention.idempotency_key_ttl must be positive")
		}
		r, err := cfg.Ledger.PruneIdempotencyKeys(ctx, cfg.Now().Add(-cfg.KeyTTL), cfg.BatchSize)
		res.IdempotencyKeys = &r
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// RetainEvery runs Retain every interval until ctx ends, logging each run
// that removed something and each failure (a failed run is retried at the
// next tick). It is what the long-running processes call.
func RetainEvery(ctx context.Context, interval time.Duration, cfg RetentionConfig, log *slog.Logger) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := Retain(ctx, cfg)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("retention run failed; retrying at the next interval", "err", err, "interval", interval.String())
		case err == nil:
			if n := res.deleted(); n > 0 {
				keys := int64(0)
				if res.IdempotencyKeys != nil {
					keys = res.IdempotencyKeys.Deleted
				}
				log.Info("retention removed rows", "deleted", n, "inbox", fmt.Sprint(res.Inbox), "idempotency_keys", keys)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r RetentionResult) deleted() int64 {
	var n int64
	for _, p := range r.Inbox {
		n += p.Deleted
	}
	if r.IdempotencyKeys != nil {
		n += r.IdempotencyKeys.Deleted
	}
	return n
}
