package delivery

import (
	"fmt"
	"log/slog"

	"github.com/cenkalti/backoff/v5"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/internal/historyhold"
	"github.com/posthorn/posthorn/relay/internal/lifecycle"
	"github.com/posthorn/posthorn/relay/internal/relaymetrics"
	"github.com/posthorn/posthorn/relay/internal/standbygate"
)

// Parts are what a relay of either mode is built from beside its stores
// and its own loop, made alike from its settings by NewParts.
type Parts struct {
	Metrics *relaymetrics.Metrics
	Life    *lifecycle.Lifecycle
	Retry   *backoff.ExponentialBackOff
	Stuck   *StuckTracker
	// Fences is set in exactly-once mode, Standby when the standbys are
	// required.
	Fences  *Fences
	Standby *standbygate.Gate
	History *historyhold.Hold
}

// NewParts builds the parts of a relay with the checked settings cfg
// (relay.Settings.Checked) that publishes to sink and logs to log;
// skipPositions is the negative control's switch (UnsafeSkipPositions).
func NewParts(cfg relay.Settings, sink core.Sink, skipPositions bool, log *slog.Logger) (Parts, error) {
	m, err := relaymetrics.New(cfg.Registerer, cfg.SinkName, log)
	if err != nil {
		return Parts{}, fmt.Errorf("relay metrics: %w", err)
	}
	p := Parts{
		Metrics: m,
		Life:    lifecycle.New(),
		Retry:   NewRetry(cfg.RetryInitial, cfg.RetryMax),
		Stuck:   NewStuckTracker(cfg.ParkAfterAttempts, cfg.ParkAfter),
		Standby: standbygate.New(cfg.StandbyFlush, m, log),
		History: historyhold.New(cfg.History, m, log),
	}
	if cfg.ExactlyOnce {
		if p.Fences, err = NewFences(sink, skipPositions); err != nil {
			return Parts{}, fmt.Errorf("%w: %w", relay.ErrInvalidConfig, err)
		}
	}
	return p, nil
}
