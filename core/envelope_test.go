package core_test

import (
	"errors"
	"testing"

	"github.com/posthorn/posthorn/core"
)

// TestLedgerTimelineHeader: the envelope's timeline goes on the wire and
// comes back; a row without one carries no header, even when its extra
// headers (allow-listed metadata) name one; a garbled one is refused.
func TestLedgerTimelineHeader(t *testing.T) {
	e := core.Envelope{EventID: "e-1", Kind: core.KindEvent, Type: "t", AggregateType: "account", AggregateID: "acc-1",
		Revision: 3, LedgerTimeline: 2, Headers: map[string]string{core.HeaderLedgerTimeline: "7"}}
	h := e.WireHeaders()
	if h[core.HeaderLedgerTimeline] != "2" {
		t.Fatalf("ledger_timeline %q, want the row's 2 over the extra header's", h[core.HeaderLedgerTimeline])
	}
	back, err := core.EnvelopeFromHeaders(h, nil)
	if err != nil || back.LedgerTimeline != 2 {
		t.Fatalf("read back: %+v %v", back, err)
	}
	e.LedgerTimeline = 0
	if v, ok := e.WireHeaders()[core.HeaderLedgerTimeline]; ok {
		t.Fatalf("a row without a timeline carries ledger_timeline %q", v)
	}
	h[core.HeaderLedgerTimeline] = "0"
	if _, err := core.EnvelopeFromHeaders(h, nil); !errors.Is(err, core.ErrBadEnvelope) {
		t.Fatalf("ledger_timeline 0: %v, want ErrBadEnvelope", err)
	}
}
