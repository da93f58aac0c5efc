package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/ops"
)

// `posthorn retention` prunes the inbox behind the safe horizon and the
// expired idempotency keys; reconciliation stays clean over events whose
// disposition an earlier run proved and retention removed, and still
// reports a disposition missing for any other reason.
func TestRetentionCommandAndReconcileAfterIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsCLIRig(t)
	r.env = append(r.env, "POSTHORN_RETENTION__INBOX_MARGIN=1h", "POSTHORN_RETENTION__IDEMPOTENCY_KEY_TTL=24h")
	// The database keeps keys for the lifetime migrate wrote into it (720h
	// until then), whatever a retention run's configuration says.
	if code, _, stderr := runCLI(t, r.env, "migrate"); code != 0 {
		t.Fatalf("migrate: code %d: %s", code, stderr)
	}
	r.postCovered(4)
	// Two days pass.
	for _, q := range []string{`UPDATE outbox SET created_at = created_at - interval '48 hours'`,
		`UPDATE idempotency_keys SET created_at = created_at - interval '48 hours'`} {
		if _, err := r.ledger.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.consumer.Exec(ctx, `UPDATE consumer_inbox SET updated_at = updated_at - interval '48 hours', received_at = received_at - interval '48 hours'`); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runCLI(t, r.env, "retention", "--json")
	var res ops.RetentionResult
	if code != 0 || json.Unmarshal([]byte(stdout), &res) != nil {
		t.Fatalf("retention: code %d, %s %s", code, stdout, stderr)
	}
	// balance-projection keeps the last applied revision of each of its 3
	// accounts; audit-log (replay window 0s here) keeps nothing final.
	if res.Inbox[projection.Name].Deleted != 8-3 || res.Inbox[auditlog.Name].Deleted != 8 || res.IdempotencyKeys == nil || res.IdempotencyKeys.Deleted != 4 {
		t.Fatalf("retention result %s", stdout)
	}
	code, rep, stderr := r.reconcile()
	if code != 0 || !rep.Clean {
		t.Fatalf("reconcile after retention: code %d, %+v, %s", code, rep, stderr)
	}
	for _, c := range rep.Consumers {
		if c.Pruned != res.Inbox[c.Name].Deleted {
			t.Fatalf("%s: pruned %d, want %d", c.Name, c.Pruned, res.Inbox[c.Name].Deleted)
		}
	}

	// A disposition lost above the proven coverage is still a discrepancy.
	r.post(1)
	r.deliver("")
	var lost string
	if err := r.consumer.QueryRow(ctx, `DELETE FROM consumer_inbox WHERE event_id = (SELECT event_id FROM consumer_inbox
		WHERE consumer = $1 ORDER BY received_at DESC LIMIT 1) AND consumer = $1 RETURNING event_id`, auditlog.Name).Scan(&lost); err != nil {
		t.Fatal(err)
	}
	code, rep, _ = r.reconcile()
	if code != 1 || rep.Clean {
		t.Fatalf("a lost disposition: code %d, clean %v", code, rep.Clean)
	}
	for _, c := range rep.Consumers {
		if c.Name == auditlog.Name && (len(c.Discrepancies.Unproven.IDs) != 1 || c.Discrepancies.Unproven.IDs[0] != lost) {
			t.Fatalf("audit-log unproven %+v, want %s", c.Discrepancies.Unproven, lost)
		}
	}
	if code, _, stderr := runCLI(t, r.env, "retention", "--only", "nope"); code == 0 || !strings.Contains(stderr, "--only") {
		t.Fatalf("bad --only: code %d, %s", code, stderr)
	}
}
