package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/ops"
)

func runCleanup(ctx context.Context, args []string) error {
	fs := newFlags("cleanup", "database.url", "archive.dir", "cleanup.replay_window", "cleanup.batch_size")
	dry := fs.Bool("dry-run", false, "show what would be deleted (counts and id range), delete nothing")
	asJSON := fs.Bool("json", false, "print one JSON object")
	// Cleanup re-reads the archive segments of the rows it would delete.
	p, err := fs.start(ctx, args, needs{ledger: 2, requireArchive: true})
	if err != nil {
		return err
	}
	defer p.close()
	cfg := p.cfg
	res, err := ops.Cleanup(ctx, ops.CleanupConfig{
		Ledger: opsstore.New(p.ledger), Archive: p.archive, Required: requiredConsumers(cfg),
		ReplayWindow: cfg.Cleanup.ReplayWindow, BatchSize: cfg.Cleanup.BatchSize, DryRun: *dry,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	plan := res.Plan
	fmt.Printf("boundary: archive through id %d, consumers covered through id %d (journal sequence %d), replay window %s (rows created before %s)\n",
		res.ArchiveThrough, res.CoveredThrough, res.CoveredSequence, cfg.Cleanup.ReplayWindow, plan.Cutoff.UTC().Format("2006-01-02T15:04:05Z"))
	switch {
	case plan.Rows == 0:
		fmt.Println("nothing to delete")
	case res.DryRun:
		fmt.Printf("dry run: would delete %d rows, ids %d..%d (journals up to sequence %d); %d covered rows stay inside the replay window\n",
			plan.Rows, plan.FirstID, plan.LastID, plan.JournalFloor, plan.InsideWindow)
	default:
		fmt.Printf("deleted %d rows, ids %d..%d, in %d batches; %d covered rows stay inside the replay window\n",
			res.Deleted, res.DeletedFirstID, res.DeletedLastID, res.Batches, plan.InsideWindow)
	}
	return nil
}
