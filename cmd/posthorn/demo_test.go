package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
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

// A relay the demo cut short on purpose logs the cancellations the cut
// causes at INFO, saying so; before the cut, and for any other error, the
// level stays: a real failure during the demo still logs as one.
func TestDemoPlannedCrashLogsOnlyItsOwnConsequencesAtInfo(t *testing.T) {
	var buf bytes.Buffer
	cut := new(atomic.Bool)
	log := slog.New(plannedCrash{Handler: slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}), cut: cut}).With("owner", "demo-relay-2")
	canceled := fmt.Errorf("write relay markers: %w", context.Canceled)
	log.Error("write relay markers", "err", canceled)
	cut.Store(true)
	log.Error("write relay markers", "err", canceled)
	log.Error("read outbox", "err", errors.New("connection refused"))
	log.Warn("release leases on stop", "err", canceled)
	want := []struct{ level, msg string }{
		{"ERROR", "write relay markers"},
		{"INFO", "demo: expected after the simulated crash: write relay markers"},
		{"ERROR", "read outbox"},
		{"INFO", "demo: expected after the simulated crash: release leases on stop"},
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d records, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec["level"] != want[i].level || rec["msg"] != want[i].msg || rec["owner"] != "demo-relay-2" || rec["err"] == nil {
			t.Errorf("record %d: %s; want %s %q with owner and err", i, line, want[i].level, want[i].msg)
		}
	}
	// At the demo's default level (warn) the planned consequences are not shown.
	buf.Reset()
	quiet := slog.New(plannedCrash{Handler: slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}), cut: cut})
	quiet.Error("write relay markers", "err", canceled)
	if buf.Len() != 0 {
		t.Errorf("at warn the planned consequence was logged: %s", buf.String())
	}
}
