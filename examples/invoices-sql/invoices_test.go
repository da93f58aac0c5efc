// Package invoicessql tests invoices.py, the example of a service outside
// Go: it publishes through posthorn_publish and consumes through
// posthorn_inbox_receive.
package invoicessql

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/exampletest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// python is Debian's Python 3, which has python3-psycopg (.ci/run installs
// it); a python3 earlier on PATH (pyenv) may lack psycopg.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if err := exec.Command(p, "-c", "import psycopg").Run(); err == nil {
			return p
		}
	}
	t.Fatal("no python3 with psycopg 3 (Debian package python3-psycopg; .ci/run installs it)")
	return ""
}

func script(t *testing.T, py string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(py, append([]string{"invoices.py"}, args...)...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("invoices.py %v: %v\n%s", args, err, stderr)
	}
	return out
}

// TestInvoicesSQLEndToEndThroughRelayKills: the Python script issues 300
// invoices (each with its event through posthorn_publish, in one
// transaction) while the relay is SIGKILLed twice and restarted; its
// consumer, reading the topic from the start on every pass through
// posthorn_inbox_receive, ends with one line per invoice, each customer's
// revisions 1..n applied in order; reading the topic again applies nothing.
func TestInvoicesSQLEndToEndThroughRelayKills(t *testing.T) {
	if _, err := exec.LookPath("kcat"); err != nil {
		t.Fatal("kcat is not installed (Debian package kcat; .ci/run installs it)")
	}
	py := python(t)
	ctx := context.Background()
	path := exampletest.Start(t, "events.customer")
	script(t, py, "migrate", "--db", path.LedgerURL, "--consumer-db", path.ConsumerURL)
	const invoices = 300
	path.KillRelayWhile(t, 2, func() {
		script(t, py, "publish", "--db", path.LedgerURL, "--count", "150", "--customers", "9", "--seed", "1")
		script(t, py, "publish", "--db", path.LedgerURL, "--count", "150", "--customers", "9", "--seed", "2")
	})
	ledger := pgtest.Pool(t, path.LedgerURL, 2)
	cons := pgtest.Pool(t, path.ConsumerURL, 2)
	var summary map[string]int
	// The relay may still be catching up: consume again until every
	// invoice is there (the checks below say what is missing if not).
	wait.Until(90*time.Second, func() (bool, string) {
		if err := json.Unmarshal(script(t, py, "consume", "--consumer-db", path.ConsumerURL, "--broker", path.Brokers[0]), &summary); err != nil {
			t.Fatal(err)
		}
		var lines int
		if err := cons.QueryRow(ctx, `SELECT count(*) FROM customer_invoices`).Scan(&lines); err != nil {
			t.Fatal(err)
		}
		return lines == invoices, ""
	})
	// Reading the whole topic again applies nothing twice: every record
	// is a duplicate to the inbox.
	var again map[string]int
	if err := json.Unmarshal(script(t, py, "consume", "--consumer-db", path.ConsumerURL, "--broker", path.Brokers[0]), &again); err != nil {
		t.Fatal(err)
	}
	if again["apply"] != 0 || again["duplicate"] < invoices {
		t.Fatalf("second read of the topic: %v, want 0 applied and every record a duplicate", again)
	}
	// One line per invoice: the same invoices, customers and amounts.
	want := pgtest.Column[string](t, ledger, `SELECT id || ' ' || customer || ' ' || amount_cents FROM invoices ORDER BY id`)
	got := pgtest.Column[string](t, cons, `SELECT invoice_id || ' ' || customer || ' ' || amount_cents FROM customer_invoices ORDER BY invoice_id`)
	if len(want) != invoices || len(got) != len(want) {
		t.Fatalf("%d invoices, %d lines applied (summary %v)", len(want), len(got), summary)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("line %d: %q, the invoice is %q", i, got[i], want[i])
		}
	}
	// In order per customer: applied in revision order, 1..n.
	rows := pgtest.Column[string](t, cons, `SELECT customer || ' ' || revision FROM customer_invoices ORDER BY customer, applied_seq`)
	next := map[string]int{}
	for _, r := range rows {
		var c string
		var rev int
		if _, err := fmt.Sscan(r, &c, &rev); err != nil {
			t.Fatal(err)
		}
		next[c]++
		if rev != next[c] {
			t.Fatalf("customer %s: revision %d applied where %d was next", c, rev, next[c])
		}
	}
	var applied int
	if err := cons.QueryRow(ctx, `SELECT count(*) FROM consumer_inbox WHERE consumer = 'invoice-book' AND disposition = 'applied'`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied != invoices {
		t.Fatalf("inbox: %d applied, want %d", applied, invoices)
	}
	t.Logf("%d invoices applied once, in order per customer, through 2 relay kills; last pass: %v", invoices, summary)
}
