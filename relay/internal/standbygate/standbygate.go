// Package standbygate holds a relay's batches back until the ledger's
// standbys have flushed their commits (relay.standby_flush: required), so
// that a failover never promotes a ledger that lacks an event the world
// has seen. Both relay modes use it.
package standbygate

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/internal/lifecycle"
	"github.com/posthorn/posthorn/relay/internal/relaymetrics"
)

// quickPolls is how long a wait reads the standbys' positions every
// millisecond before it backs off.
const quickPolls = 100 * time.Millisecond

// Gate holds batches back until enough standbys have flushed them.
// It is owned by one relay loop: not safe for concurrent use.
type Gate struct {
	cfg       relay.StandbyFlush
	m         *relaymetrics.Metrics
	log       *slog.Logger
	heldSince time.Time // zero: not held
	warned    time.Time // when the current hold was last logged
}

// New returns the gate of cfg for a relay reporting through m, or nil
// when cfg does not require the standbys. cfg must have been checked by
// its relay (relay.Settings.Checked: defaulted, with a probe).
func New(cfg relay.StandbyFlush, m *relaymetrics.Metrics, log *slog.Logger) *Gate {
	if !cfg.Required() {
		return nil
	}
	return &Gate{cfg: cfg, m: m, log: log}
}

// Wait returns true once enough standbys have flushed WAL up to target;
// a target of 0 means the primary's WAL insert position at the first read,
// which is past the commit of every row read before the call. It returns
// false when until passes first (the caller renews its leases and comes
// back), or when life stops or ctx ends; an error when the standbys cannot
// be read. It returns the target it waited for. While it waits the gauge
// posthorn_relay_held_by_standby_seconds shows for how long the relay has
// been held, and a hold longer than WarnAfter is logged.
func (g *Gate) Wait(ctx context.Context, life *lifecycle.Lifecycle, target relay.LSN, until time.Time) (relay.LSN, bool, error) {
	start := time.Now()
	poll := 250 * time.Microsecond
	for {
		st, err := g.cfg.Probe.StandbyStatus(ctx)
		if err != nil {
			return target, false, fmt.Errorf("read the standbys' flush positions (relay.standby_flush: required): %w", err)
		}
		if target == 0 {
			target = st.Insert
		}
		flushed, held := g.flushed(st, target)
		if flushed {
			g.release(time.Since(start))
			return target, true, nil
		}
		g.hold(target, held)
		if !time.Now().Add(poll).Before(until) || life.Stopping() || ctx.Err() != nil {
			return target, false, nil
		}
		life.Sleep(ctx, poll)
		// A healthy standby reports its flush within milliseconds: look
		// again every millisecond at first (a longer step is added to
		// every batch's latency), then back off towards PollMax.
		if time.Since(start) < quickPolls {
			poll = min(2*poll, time.Millisecond)
		} else {
			poll = min(2*poll, g.cfg.PollMax)
		}
	}
}

// flushed reports whether Count of the standbys that count have flushed
// target; if not, it describes what holds the relay back.
func (g *Gate) flushed(st relay.StandbyStatus, target relay.LSN) (bool, []any) {
	var ok int
	var seen, behind []string
	for _, s := range st.Standbys {
		if len(g.cfg.Names) > 0 && !slices.Contains(g.cfg.Names, s.Name) {
			continue
		}
		seen = append(seen, s.Name)
		if s.Flush >= target {
			ok++
		} else {
			behind = append(behind, fmt.Sprintf("%q state %s flushed to %s", s.Name, s.State, s.Flush))
		}
	}
	if ok >= g.cfg.Count {
		return true, nil
	}
	var absent []string
	for _, n := range g.cfg.Names {
		if !slices.Contains(seen, n) {
			absent = append(absent, fmt.Sprintf("%q", n))
		}
	}
	return false, []any{"need", g.cfg.Count, "flushed", ok, "wal_position", target.String(),
		"behind", strings.Join(behind, "; "), "not_connected", strings.Join(absent, ", ")}
}

func (g *Gate) hold(target relay.LSN, why []any) {
	now := time.Now()
	if g.heldSince.IsZero() {
		g.heldSince = now
	}
	held := now.Sub(g.heldSince)
	g.m.HeldByStandby.Set(held.Seconds())
	if held >= g.cfg.WarnAfter && now.Sub(g.warned) >= time.Minute {
		g.warned = now
		g.log.Warn("relay held back by the ledger's standbys: nothing is published until enough of them have flushed it (relay.standby_flush: required); a standby that is down or lagging holds the relay until it catches up",
			append([]any{"held_for", held.Round(time.Millisecond).String()}, why...)...)
	}
}

func (g *Gate) release(waited time.Duration) {
	g.m.StandbyWait.Observe(waited.Seconds())
	if g.heldSince.IsZero() {
		return
	}
	if !g.warned.IsZero() {
		g.log.Info("the standbys caught up; publishing again", "held_for", time.Since(g.heldSince).Round(time.Millisecond).String())
	}
	g.heldSince, g.warned = time.Time{}, time.Time{}
	g.m.HeldByStandby.Set(0)
}
