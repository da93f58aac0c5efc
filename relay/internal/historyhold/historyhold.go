// Package historyhold holds a relay's publishing while the ledger does not
// run on the history an operator accepted (after a failover, until
// posthorn failover recover), in both relay modes.
package historyhold

import (
	"context"
	"log/slog"
	"time"

	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/internal/relaymetrics"
)

// Poll is how often a relay held by the history looks again.
const Poll = time.Second

// Hold is a relay's use of a HistoryGate, shared by both relay
// modes: the first refusal is logged at ERROR and raises
// posthorn_relay_held_by_ledger_history; the return to the accepted
// history (posthorn failover recover) is logged and lowers it. Owned by
// one goroutine.
type Hold struct {
	gate relay.HistoryGate
	m    *relaymetrics.Metrics
	log  *slog.Logger
	held bool
}

// New returns the hold of gate, reporting through m and log;
// with a nil gate it holds nothing.
func New(gate relay.HistoryGate, m *relaymetrics.Metrics, log *slog.Logger) *Hold {
	return &Hold{gate: gate, m: m, log: log}
}

// Accepted checks the history before a batch is published.
func (h *Hold) Accepted(ctx context.Context) bool {
	if h.gate == nil {
		return true
	}
	err := h.gate.Check(ctx)
	if ctx.Err() != nil {
		return false
	}
	switch {
	case err != nil && !h.held:
		h.held = true
		h.m.HeldByHistory.Set(1)
		h.log.Error("RELAY HOLDS BACK PUBLISHING: the ledger's history is not the accepted one; nothing is published until posthorn failover recover accepts it (docs/operations.md, failing the ledger over)",
			"err", err)
	case err == nil && h.held:
		h.held = false
		h.m.HeldByHistory.Set(0)
		h.log.Info("the ledger's history is accepted: publishing resumes")
	}
	return err == nil
}
