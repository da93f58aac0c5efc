package configs

import (
	"time"

	"github.com/posthorn/posthorn/ops"
)

// Retention configures what keeps tables from growing for ever: the
// consumers' inbox and the Posting API's idempotency keys (`posthorn
// retention`, and on a schedule inside `posthorn consume` and `posthorn
// api`).
type Retention struct {
	// Interval is how often the long-running processes run retention;
	// 0 turns the schedule off (the command still works).
	Interval time.Duration `koanf:"interval"`
	// BatchSize is the most rows deleted per statement (short locks).
	BatchSize int `koanf:"batch_size"`
	// InboxMargin is how long a final inbox row stays at least. An ordered
	// consumer's row (balance-projection) goes once it is below the
	// account's applied revision and older than this: a repeat is still
	// recognised by revision. An unordered consumer's row (audit-log) goes
	// once older than cleanup.replay_window plus this margin.
	InboxMargin time.Duration `koanf:"inbox_margin"`
	// IdempotencyKeyTTL is how long the Posting API recognises an
	// Idempotency-Key; a request that repeats an older key is a new posting.
	IdempotencyKeyTTL time.Duration `koanf:"idempotency_key_ttl"`
}

func defaultRetention() Retention {
	return Retention{Interval: time.Hour, BatchSize: ops.DefaultBatchSize, InboxMargin: 24 * time.Hour, IdempotencyKeyTTL: 30 * 24 * time.Hour}
}

func (r Retention) validate() error {
	if r.Interval < 0 {
		return fieldErr("retention.interval", "must not be negative (0 turns the schedule off), is %s", r.Interval)
	}
	if r.BatchSize < 1 || r.BatchSize > 100_000 {
		return fieldErr("retention.batch_size", "is %d, want 1 to 100000", r.BatchSize)
	}
	if r.InboxMargin < time.Minute {
		return fieldErr("retention.inbox_margin", "is %s, want at least 1m", r.InboxMargin)
	}
	if r.IdempotencyKeyTTL < time.Hour {
		return fieldErr("retention.idempotency_key_ttl", "is %s, want at least 1h (clients retry with the same key)", r.IdempotencyKeyTTL)
	}
	return nil
}

// validateCommandOwners checks sink.amqp.command_owners (kept out of
// sink.go's own validation, which another change rewrites).
func validateCommandOwners(s Sink) error {
	for service, owner := range s.AMQP.CommandOwners {
		if service == "" || owner == "" {
			return fieldErr("sink.amqp.command_owners."+service, "needs a service and its owning consumer, got %q: %q", service, owner)
		}
	}
	return nil
}
