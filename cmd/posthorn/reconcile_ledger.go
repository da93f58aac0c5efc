package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// printLedgerProof prints what reconcile proved of the ledger from its
// journal, and the rows of the cut no configured consumer subscribes to.
func printLedgerProof(w io.Writer, rep ops.Report) {
	l := rep.Ledger
	if l.Clean() {
		fmt.Fprintf(w, "ledger: %d balances and %d account revisions equal their journal lines; %d ledger events match their lines\n",
			l.Balances, l.Accounts, l.Events)
	} else {
		fmt.Fprintf(w, "ledger: DISCREPANCIES against the journal: %d balances, %d account revisions, %d events (no coverage recorded)\n",
			l.BalanceMismatch.Count, l.RevisionMismatch.Count, l.EventMismatch.Count)
		printLedgerDetails(w, l.Details)
	}
	for _, u := range rep.UnwatchedTopics {
		if u.Kind == string(core.KindEvent) {
			fmt.Fprintf(w, "NOT RECONCILED: %d events on topic %s (first outbox id %d): no configured consumer subscribes to it, so none is covered; "+
				"add the consumer that reads it to reconcile.consumers with topics: [%s]\n", u.Rows, printable(u.Topic), u.FirstOutboxID, printable(u.Topic))
		} else {
			fmt.Fprintf(w, "not reconciled: %d commands on topic %s: no configured consumer subscribes to it (a command's handler is read only when configured with its topic)\n",
				u.Rows, printable(u.Topic))
		}
	}
	if len(rep.Unwatched.IDs) > 0 {
		fmt.Fprintf(w, "  events no consumer is configured for (first %d of %d):\n    %s\n", len(rep.Unwatched.IDs), rep.Unwatched.Count,
			strings.Join(rep.Unwatched.IDs, "\n    "))
	}
}

// printBalanceView prints a consumer's balance view that does not match.
func printBalanceView(w io.Writer, v *ops.BalanceViewCheck) {
	if v == nil || v.Mismatch.Count == 0 {
		return
	}
	fmt.Fprintf(w, "  balance view %s differs from the journal: %d rows of %d compared\n", v.View, v.Mismatch.Count, v.Compared)
	printLedgerDetails(w, v.Details)
}

func printLedgerDetails(w io.Writer, ds []ops.LedgerDiscrepancy) {
	for _, d := range ds {
		what := printable(d.Account)
		if d.Currency != "" {
			what += " " + printable(d.Currency)
		}
		if d.EventID != "" {
			what += " event " + d.EventID
		}
		fmt.Fprintf(w, "    %s %s: %s\n", d.Class, what, printable(d.Detail))
	}
}
