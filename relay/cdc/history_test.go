package cdc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// TestCDCRelayHoldsOnAnUnacceptedHistory: while the ledger runs on a
// history an operator has not accepted (after a failover, until posthorn
// failover recover), the CDC relay streams but publishes nothing, says why
// at ERROR and in posthorn_relay_held_by_ledger_history, and publishes
// everything once the history is accepted. The control is a CDC relay
// without the check on a second ledger in the same state: it publishes on
// the unaccepted history.
func TestCDCRelayHoldsOnAnUnacceptedHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	unaccept := `INSERT INTO posthorn.ledger_timelines (system_identifier, timeline, accepted_by, note, accepted_at)
SELECT system_identifier, timeline + 1, 'test', 'another history', now() + interval '1 hour' FROM posthorn.ledger_history()`
	control, gated := newFixture(t, nil), newFixture(t, nil)
	for _, f := range []*fixture{control, gated} {
		if _, err := f.pool.Exec(ctx, unaccept); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := postgres.ParseConfig(gated.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	watch := postgres.NewHistoryWatch()
	watch.Watch(cfg)
	watched, err := postgres.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watched.Close)
	watch.Recheck(watched)

	control.start("control", nil)
	h := gated.start("gated", func(c *relay.Settings) { c.History = watch })
	control.waitStreaming()
	gated.waitStreaming()
	for _, f := range []*fixture{control, gated} {
		if err := relaytest.Fill(ctx, f.pool, "h", 10, 3); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, 20*time.Second, "the control relay to publish on the unaccepted history", func() bool {
		return len(control.delivered()) == 30
	})
	wait.For(t, 20*time.Second, "the gated relay to hold", func() bool {
		return promtest.Value(t, h.reg, "posthorn_relay_held_by_ledger_history") == 1
	})
	time.Sleep(2 * time.Second) // a window in which the gated relay may publish nothing
	if n := len(gated.delivered()); n != 0 {
		t.Fatalf("the gated CDC relay published %d events on the unaccepted history", n)
	}
	if !strings.Contains(gated.logs.String(), "RELAY HOLDS BACK PUBLISHING") {
		t.Fatalf("no ERROR line says why the relay holds")
	}
	t.Logf("control (no history check): 30 events published on the unaccepted history; gated: 0")
	if _, err := gated.pool.Exec(ctx, `DELETE FROM posthorn.ledger_timelines WHERE accepted_by = 'test'`); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 20*time.Second, "the gated relay to publish once the history is accepted", func() bool {
		return len(gated.delivered()) == 30 && promtest.Value(t, h.reg, "posthorn_relay_held_by_ledger_history") == 0
	})
}
