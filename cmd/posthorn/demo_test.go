package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestDemoJSON runs the demo as a user would (throwaway PostgreSQL,
// in-process Kafka-protocol broker, restarts mid-run) and checks every
// field of the one JSON object the contract promises on stdout.
func TestDemoJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	t.Parallel()
	code, stdout, stderr := runCLI(t, nil, "demo", "--postings", "300", "--json")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if n := strings.Count(strings.TrimSpace(stdout), "\n"); n != 0 {
		t.Fatalf("stdout has %d lines, want one JSON object:\n%s", n+1, stdout)
	}
	var got struct {
		Postings             *int     `json:"postings"`
		Events               *int64   `json:"events"`
		Relayed              *int64   `json:"relayed"`
		Applied              *int64   `json:"applied"`
		DuplicatesSuppressed *int64   `json:"duplicates_suppressed"`
		BalancesMatch        *bool    `json:"balances_match"`
		Reconcile            *string  `json:"reconcile"`
		ElapsedS             *float64 `json:"elapsed_s"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(stdout)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("stdout is not the contract's object: %v\n%s", err, stdout)
	}
	switch {
	case got.Postings == nil || got.Events == nil || got.Relayed == nil || got.Applied == nil ||
		got.DuplicatesSuppressed == nil || got.BalancesMatch == nil || got.Reconcile == nil || got.ElapsedS == nil:
		t.Fatalf("a field is missing: %s", stdout)
	case *got.Postings != 300:
		t.Errorf("postings %d, want 300", *got.Postings)
	case *got.Events < 2*300 || *got.Events > 4*300:
		t.Errorf("events %d, want 2 to 4 per posting", *got.Events)
	case *got.Relayed != *got.Events || *got.Applied != *got.Events:
		t.Errorf("relayed %d, applied %d, want both = events %d", *got.Relayed, *got.Applied, *got.Events)
	case *got.DuplicatesSuppressed < 0:
		t.Errorf("duplicates_suppressed %d", *got.DuplicatesSuppressed)
	case !*got.BalancesMatch || *got.Reconcile != "clean":
		t.Errorf("balances_match %v, reconcile %q", *got.BalancesMatch, *got.Reconcile)
	case *got.ElapsedS <= 0:
		t.Errorf("elapsed_s %v", *got.ElapsedS)
	}
	// --json keeps logs at warn and above, all on stderr.
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if strings.Contains(line, `"level":"INFO"`) || strings.Contains(line, `"level":"DEBUG"`) {
			t.Errorf("--json logged below warn: %s", line)
		}
	}
}

func TestDemoRejectsBadFlags(t *testing.T) {
	code, _, stderr := runCLI(t, nil, "demo", "--postings", "0")
	if code != 1 || !strings.Contains(stderr, "--postings") {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, nil, "demo", "--sink", "carrier-pigeon")
	if code != 1 || !strings.Contains(stderr, "sink.kind") {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
}
