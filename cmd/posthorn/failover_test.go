package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestFailoverCommand runs `posthorn failover check` and `recover` as a
// process: clean on the accepted history (exit 0); after the ledger moved
// to a history nobody accepted (here: restored on another server, as the
// system identifier says), check and a dry run exit 1 naming it and write
// nothing, recover accepts it and, with the rig's rows never relayed,
// exits 1 naming them as not whole; check is clean again; a bad flag
// exits 2 naming it.
func TestFailoverCommand(t *testing.T) {
	t.Parallel()
	r := newOpsCLIRig(t)
	r.postings(3)
	r.deliver("")
	check := func(args ...string) (int, string, string) {
		return runCLI(t, r.env, append([]string{"failover"}, args...)...)
	}
	code, out, errOut := check("check")
	if code != 0 || !strings.Contains(out, "(accepted)") || !strings.Contains(out, "inbox of balance-projection") {
		t.Fatalf("check on the accepted history: code %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "the sink is not read") {
		t.Fatalf("check on a memory sink does not say the sink is not read:\n%s", errOut)
	}
	if _, err := r.ledger.Exec(context.Background(), `UPDATE posthorn.ledger_timelines SET system_identifier = system_identifier + 1`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check"}, {"recover", "--dry-run"}} {
		code, out, errOut := check(args...)
		if code != 1 || !strings.Contains(out, "NOT ACCEPTED") {
			t.Fatalf("%v on an unaccepted history: code %d, want 1\n%s%s", args, code, out, errOut)
		}
	}
	// The rig delivers without a relay, so its outbox rows stay unrelayed:
	// recover accepts the history and says the system is not whole yet.
	code, out, errOut = check("recover", "--settle", "0")
	if code != 1 || !strings.Contains(out, "history accepted") || !strings.Contains(out, "STILL NOT WHOLE") ||
		!strings.Contains(out, "outbox rows unrelayed") {
		t.Fatalf("recover: code %d, want 1 naming the unrelayed rows\n%s%s", code, out, errOut)
	}
	var rep struct {
		History struct {
			Accepted bool `json:"accepted"`
		} `json:"history"`
		Lost []any `json:"lost"`
	}
	code, out, errOut = check("check", "--json")
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.History.Accepted || len(rep.Lost) != 0 {
		t.Fatalf("check after recover: code %d, %+v, %v\n%s%s", code, rep, err, out, errOut)
	}
	if code, _, errOut := check("check", "--sink-since", "-1h"); code != 2 || !strings.Contains(errOut, "--sink-since") {
		t.Fatalf("--sink-since -1h: code %d, %s", code, errOut)
	}
	if code, _, errOut := check("recover", "--settle", "-1s"); code != 2 || !strings.Contains(errOut, "--settle") {
		t.Fatalf("--settle -1s: code %d, %s", code, errOut)
	}
}
