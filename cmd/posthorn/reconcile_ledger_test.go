package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// reconcile as an operator runs it: events a team published with
// posthorn_publish are NOT RECONCILED (exit 1) until a consumer configured
// with their topic proves them; a balance changed behind the ledger's back
// and a projection balance changed in the consumer's database are named.
// Each finding has its control: the same rows reconcile clean once the
// topic is configured, and before the tampering.
func TestReconcileNamesUnwatchedTopicsAndLedgerTampering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsCLIRig(t)
	r.postCovered(3)
	for i := range 2 {
		if _, err := r.ledger.Exec(ctx, `SELECT posthorn_publish('wallet', 'w-1', 'wallet.credited', jsonb_build_object('n', $1::int))`, i); err != nil {
			t.Fatal(err)
		}
	}
	r.post(0) // marks the published rows relayed through resend
	r.deliver("")

	code, stdout, stderr := runCLI(t, r.env, "reconcile")
	if code != 1 || !strings.Contains(stdout, "NOT RECONCILED: 2 events on topic events.wallet") || strings.Contains(stdout, "result: clean") {
		t.Fatalf("published events without a consumer configured: code %d\n%s%s", code, stdout, stderr)
	}

	var consumerURL string
	for _, e := range r.env {
		if v, ok := strings.CutPrefix(e, "POSTHORN_CONSUMER__DATABASE__URL="); ok {
			consumerURL = v
		}
	}
	cfg := filepath.Join(t.TempDir(), "posthorn.yaml")
	yaml := fmt.Sprintf(`reconcile:
  consumers:
    - name: balance-projection
      database_url: %[1]q
      balance_view: projection_balances
    - name: audit-log
      database_url: %[1]q
      topics: [ledger.events, events.wallet]
`, consumerURL)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, r.env, "reconcile", "--config", cfg)
	if code != 0 || !strings.Contains(stdout, "result: clean") || !strings.Contains(stdout, "ledger: 3 balances and 3 account revisions equal their journal lines; 6 ledger events") {
		t.Fatalf("with a consumer of events.wallet: code %d\n%s%s", code, stdout, stderr)
	}

	pgtest.ShiftBalance(t, r.ledger, "acc-1", 100000000)
	code, stdout, stderr = runCLI(t, r.env, "reconcile", "--config", cfg)
	if code != 1 || !strings.Contains(stdout, "ledger: DISCREPANCIES") || !strings.Contains(stdout, "balance acc-1 EUR: balance 100000000, journal lines sum to 0") ||
		strings.Contains(stdout, "coverage recorded:") {
		t.Fatalf("balance changed behind the ledger's back: code %d\n%s%s", code, stdout, stderr)
	}
	pgtest.ShiftBalance(t, r.ledger, "acc-1", -100000000)

	if _, err := r.consumer.Exec(ctx, `UPDATE projection_balances SET balance = balance + 500 WHERE account = 'acc-2'`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, r.env, "reconcile", "--config", cfg)
	if code != 1 || !strings.Contains(stdout, "balance view projection_balances differs from the journal: 1 rows of 3 compared") ||
		!strings.Contains(stdout, "balance_view acc-2 EUR") {
		t.Fatalf("projection balance changed: code %d\n%s%s", code, stdout, stderr)
	}
}
