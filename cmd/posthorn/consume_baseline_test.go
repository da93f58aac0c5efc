package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// `posthorn consume baseline` writes the balance projection's state at the
// ledger's cut once: the JSON names what the cut holds, a second run is
// refused, and so are another consumer and --bootstrap-topic without
// --only.
func TestConsumeBaselineCLI(t *testing.T) {
	t.Parallel()
	ledgerURL, ledger := pgtest.Ledger(t)
	consumerURL, _ := pgtest.Consumer(t)
	store := ledgerstore.New(ledger, ledgerstore.Config{})
	for i, acc := range []string{"acc-a", "acc-b", "acc-a"} {
		if _, _, err := store.Post(context.Background(), "k-"+acc+string(rune('0'+i)), core.Posting{Entries: []core.Entry{
			{Account: acc, Direction: core.Debit, Amount: 10, Currency: "EUR"},
			{Account: "acc-c", Direction: core.Credit, Amount: 10, Currency: "EUR"},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"POSTHORN_DATABASE__URL=" + ledgerURL, "POSTHORN_CONSUMER__DATABASE__URL=" + consumerURL}
	code, stdout, stderr := runCLI(t, env, "consume", "baseline", "--json")
	if code != 0 {
		t.Fatalf("consume baseline: %d %s", code, stderr)
	}
	var out struct {
		Accounts int   `json:"accounts"`
		Events   int64 `json:"events_at_cut"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || out.Accounts != 3 || out.Events != 6 {
		t.Fatalf("baseline output %q (%v), want 3 accounts and 6 events", stdout, err)
	}
	if code, _, stderr := runCLI(t, env, "consume", "baseline"); code == 0 || !strings.Contains(stderr, "already received events") {
		t.Fatalf("a second baseline: %d %q", code, stderr)
	}
	if code, _, stderr := runCLI(t, env, "consume", "baseline", "--consumer", "audit-log"); code == 0 || !strings.Contains(stderr, "--consumer") {
		t.Fatalf("baseline of audit-log: %d %q", code, stderr)
	}
	if code, _, stderr := runCLI(t, env, "consume", "--bootstrap-topic", "replay.x"); code == 0 || !strings.Contains(stderr, "--bootstrap-topic needs --only") {
		t.Fatalf("--bootstrap-topic without --only: %d %q", code, stderr)
	}
}
