package ops

import (
	"testing"

	"github.com/posthorn/posthorn/core"
)

// A resend carries resend: true (so broker dedup lets it through) without
// touching the stored envelope's headers.
func TestResentMarksACopy(t *testing.T) {
	e := core.Envelope{EventID: "x", Headers: map[string]string{"reference": "inv-1"}}
	r := resent(e)
	if !r.OperatorRepeat() || r.Headers["reference"] != "inv-1" || r.WireHeaders()[core.HeaderResend] != "true" {
		t.Fatalf("resent: %+v", r)
	}
	if _, ok := e.Headers[core.HeaderResend]; ok || e.OperatorRepeat() {
		t.Fatalf("the original was changed: %+v", e)
	}
	if !(core.Envelope{Replay: true}).OperatorRepeat() {
		t.Fatal("a replay is an operator repeat")
	}
}
