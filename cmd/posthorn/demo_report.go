package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/ops"
)

// check stops the relay and the consumers, verifies what they did and
// reconciles by cut (what `posthorn reconcile` runs) over the same
// databases: its verdict is the summary's "reconcile".
func (d *demoRun) check(ctx context.Context) (demoSummary, error) {
	d.stopRelay(false)
	d.stopConsumers()
	var err error
	d.report, err = demo.Verify(ctx, d.ledger, d.consumer, demo.VerifyOptions{})
	if err != nil {
		return demoSummary{}, err
	}
	sum := demoSummary{
		Postings:             d.load.Postings,
		Events:               d.report.Events,
		Relayed:              d.report.Relayed,
		Applied:              d.report.MinApplied(),
		DuplicatesSuppressed: d.report.TotalDuplicates(),
		BalancesMatch:        d.report.BalancesMatch,
		Reconcile:            "clean",
		ElapsedS:             float64(time.Since(d.started).Round(100*time.Millisecond)) / float64(time.Second),
	}
	var sources []ops.ConsumerSource
	for _, c := range exampleReconcileConsumers("") {
		src, err := consumerSource(c, d.consumer)
		if err != nil {
			return sum, err
		}
		sources = append(sources, src)
	}
	d.reconcile, err = ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: opsstore.New(d.ledger), Consumers: sources})
	if err != nil {
		return sum, fmt.Errorf("reconcile: %w", err)
	}
	if !d.reconcile.Clean {
		sum.Reconcile = "discrepancies"
	}
	return sum, nil
}

// printResult prints the summary: one JSON object with --json, else for a
// person.
func (d *demoRun) printResult(sum demoSummary) error {
	if d.json {
		return json.NewEncoder(os.Stdout).Encode(sum)
	}
	d.printSummary(os.Stdout, sum)
	return nil
}

func (d *demoRun) printSummary(w io.Writer, s demoSummary) {
	fmt.Fprintf(w, "\nPosthorn demo (%s sink) finished in %.1f s\n", d.cfg.Sink.Kind, s.ElapsedS)
	fmt.Fprintf(w, "  postings committed through the API   %d (%d retried requests)\n", s.Postings, d.load.Retries)
	fmt.Fprintf(w, "  events in the outbox                 %d\n", s.Events)
	fmt.Fprintf(w, "  relayed (ACKed, then marked)         %d\n", s.Relayed)
	for _, c := range demoConsumers {
		fmt.Fprintf(w, "  applied by %-25s %d (duplicates suppressed by the inbox: %d)\n", c, d.report.Applied[c], d.report.DuplicatesSuppressed[c])
	}
	for _, r := range d.restarts {
		fmt.Fprintf(w, "  mid-run: %s\n", r)
	}
	fmt.Fprintf(w, "  balances of %d accounts: projection equals ledger: %v\n", d.report.Accounts, s.BalancesMatch)
	fmt.Fprintf(w, "  reconciliation by cut at journal sequence %d: %s\n", d.reconcile.Cut.Sequence, s.Reconcile)
	if d.clean() {
		fmt.Fprintln(w, "  every event applied exactly once per consumer, in revision order per account: clean")
		return
	}
	fmt.Fprintln(w, "  DISCREPANCIES:")
	for _, v := range d.report.Violations {
		fmt.Fprintf(w, "    %s\n", v)
	}
	for _, c := range d.reconcile.Consumers {
		if !c.Clean {
			fmt.Fprintf(w, "    reconcile %s: %+v\n", c.Name, c.Discrepancies)
		}
	}
}
