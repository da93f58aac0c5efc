package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/ops"
)

// The operator's commands as users run them: reconcile's exit codes 0, 1
// and 2 with the IDs in its JSON, resend marking rows after the ACK and
// refusing unknown IDs, archive and its verification, cleanup's refusal,
// dry run and deletion, replay from the archive.
func TestOpsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsCLIRig(t)
	env, consumer, archiveDir, reconcile := r.env, r.consumer, r.archiveDir, r.reconcile
	events := r.postings(6)

	// Nothing relayed yet: discrepancies, exit 1.
	code, rep, stderr := reconcile()
	if code != 1 || rep.Consumers[0].Discrepancies.Unrelayed.Count != int64(len(events)) {
		t.Fatalf("before relay: code %d, %+v, %s", code, rep, stderr)
	}
	// Could not run: exit 2.
	if code, _, stderr := reconcile("--cut", "999999"); code != 2 || !strings.Contains(stderr, "not provable") {
		t.Fatalf("cut beyond the ledger: code %d, %s", code, stderr)
	}
	if code, _, stderr := runCLI(t, append(env, "POSTHORN_DATABASE__URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"), "reconcile"); code != 2 {
		t.Fatalf("unreachable ledger: code %d, %s", code, stderr)
	}

	// Resend: unknown IDs refused; a range marked after the (memory) ACK.
	code, _, stderr = runCLI(t, env, "outbox", "resend", "--event-id", "0190c0de-0000-7000-8000-000000000000")
	if code != 1 || !strings.Contains(stderr, "not in the outbox") {
		t.Fatalf("resend unknown: code %d, %s", code, stderr)
	}
	maxID := r.maxID()
	code, stdout, stderr := runCLI(t, env, "outbox", "resend", "--from-id", "1", "--to-id", fmt.Sprint(maxID), "--json")
	var rs ops.ResendResult
	if code != 0 || json.Unmarshal([]byte(stdout), &rs) != nil || rs.Marked != len(events) {
		t.Fatalf("resend range: code %d, %s %s", code, stdout, stderr)
	}
	code, stdout, stderr = runCLI(t, env, "outbox", "status", "--json")
	if code != 0 || !strings.Contains(stdout, `"uncertain_count": 0`) {
		t.Fatalf("outbox status: code %d, %s %s", code, stdout, stderr)
	}

	// The consumers receive every event through their real handlers.
	r.deliver("")
	code, rep, stderr = reconcile()
	if code != 0 || !rep.Clean || rep.Consumers[0].Coverage == nil || rep.Consumers[1].Coverage == nil {
		t.Fatalf("clean run: code %d, %+v, %s", code, rep, stderr)
	}
	code, stdout, _ = runCLI(t, env, "reconcile")
	if code != 0 || !strings.Contains(stdout, "result: clean") || !strings.Contains(stdout, "coverage recorded: balance-projection") ||
		!strings.Contains(stdout, "history checked: audit-log, what changed since mark") {
		t.Fatalf("human report: code %d\n%s", code, stdout)
	}

	// Archive, verify; cleanup dry run, then for real.
	if code, _, stderr := runCLI(t, env, "cleanup", "--dry-run"); code != 1 || !strings.Contains(stderr, "no archive coverage") {
		t.Fatalf("cleanup before archive: code %d, %s", code, stderr)
	}
	if code, stdout, stderr := runCLI(t, env, "archive"); code != 0 || !strings.Contains(stdout, "segment-") {
		t.Fatalf("archive: code %d, %s %s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, env, "archive", "--verify"); code != 0 || !strings.Contains(stdout, "verified") {
		t.Fatalf("archive --verify: code %d, %s %s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, env, "cleanup", "--dry-run"); code != 0 || !strings.Contains(stdout, fmt.Sprintf("would delete %d rows", maxID)) {
		t.Fatalf("cleanup --dry-run: code %d, %s %s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, env, "cleanup"); code != 0 || !strings.Contains(stdout, fmt.Sprintf("deleted %d rows", maxID)) {
		t.Fatalf("cleanup: code %d, %s %s", code, stdout, stderr)
	}
	// The cleaned range replays from the archive, events only.
	code, stdout, stderr = runCLI(t, env, "replay", "--from-sequence", "1", "--json")
	var rp ops.ReplayResult
	if code != 0 || json.Unmarshal([]byte(stdout), &rp) != nil || rp.Sent != int64(len(events)) || rp.FromArchive != rp.Sent {
		t.Fatalf("replay from the archive: code %d, %s %s", code, stdout, stderr)
	}

	// After cleanup the report stays clean (the cleaned events are in the
	// archive); an event ID the ledger never had shows: exit 1 with the ID.
	if code, rep, stderr := reconcile(); code != 0 || !rep.Clean || rep.Consumers[0].Pass.SinceMark == 0 {
		t.Fatalf("after cleanup: code %d, %+v, %s", code, rep, stderr)
	}
	// A full pass looks every held event ID up again: the cleaned ones in
	// the archive.
	if code, rep, stderr := reconcile("--full"); code != 0 || !rep.Clean || rep.Consumers[0].Pass.SinceMark != 0 ||
		rep.Consumers[0].Pass.FullBecause != "a full pass was asked for" {
		t.Fatalf("full pass after cleanup: code %d, %+v, %s", code, rep, stderr)
	}
	stranger := "0190c0de-0000-7000-8000-00000000beef"
	if _, err := consumer.Exec(ctx, `INSERT INTO consumer_inbox (consumer, event_id, disposition) VALUES ($1, $2, 'applied')`, auditlog.Name, stranger); err != nil {
		t.Fatal(err)
	}
	code, rep, _ = reconcile()
	if code != 1 || rep.Clean || len(rep.Consumers[1].Discrepancies.Unknown.IDs) != 1 || rep.Consumers[1].Discrepancies.Unknown.IDs[0] != stranger {
		t.Fatalf("after tampering: code %d, %+v", code, rep.Consumers)
	}

	// A damaged segment fails verification.
	segs, _ := filepath.Glob(filepath.Join(archiveDir, "segment-*"))
	if len(segs) == 0 {
		t.Fatal("no segment file")
	}
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(segs[0], data, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ := runCLI(t, env, "archive", "--verify"); code != 1 || !strings.Contains(stdout, "SHA-256") {
		t.Fatalf("verify of a damaged segment: code %d, %s", code, stdout)
	}
}
