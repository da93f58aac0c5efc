package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/ops"
)

// The text report names each revision conflict with both event IDs, the
// aggregate and the revision, counts it among the discrepancies, and
// quotes what came from the wire, so an aggregate ID carrying a terminal
// control sequence reaches the operator's screen escaped.
func TestPrintReconcileNamesRevisionConflicts(t *testing.T) {
	t.Parallel()
	rc := ops.RevisionConflict{EventID: "0195-new", AppliedEventID: "0195-ghost", AggregateType: "account",
		AggregateID: "acc-\x1b[2Jbob", Revision: 7}
	rep := ops.Report{Consumers: []ops.ConsumerReport{{Name: "balance-projection",
		Discrepancies: ops.Discrepancies{RevisionConflicts: ops.ConflictClass{Count: 1, Conflicts: []ops.RevisionConflict{rc}}}}}}
	var buf bytes.Buffer
	printReconcile(&buf, rep)
	out := buf.String()
	for _, want := range []string{
		`revision conflicts (a revision applied under another event ID; not applied, never covered): 1`,
		`"account" "acc-\x1b[2Jbob" revision 7: applied event "0195-ghost", conflicting event "0195-new"`,
		"result: DISCREPANCIES (exit 1)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a raw escape character reached the report:\n%q", out)
	}
	if line := strings.Split(out, "\n")[3]; !strings.HasSuffix(strings.TrimSpace(line), " 1") {
		t.Errorf("the summary row %q does not count the conflict", line)
	}
}
