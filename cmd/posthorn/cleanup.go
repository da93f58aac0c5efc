package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/ops"
)

func init() {
	register(command{name: "cleanup", summary: "delete outbox rows below the verified boundary (relayed, covered, archived, past the replay window); --dry-run first", run: runCleanup})
}

func runCleanup(ctx context.Context, args []string) error {
	fs, path := flagSet("cleanup")
	dry := fs.Bool("dry-run", false, "show what would be deleted (counts and id range), delete nothing")
	asJSON := fs.Bool("json", false, "print one JSON object")
	keyFlags(fs, "database.url", "archive.dir", "cleanup.replay_window", "cleanup.batch_size")
	cfg, err := loadConfig(fs, path, args)
	if err != nil {
		return err
	}
	if err := cfg.RequireDatabase(); err != nil {
		return err
	}
	// Cleanup re-reads the archive segments of the rows it would delete.
	if err := cfg.RequireArchiveDir(); err != nil {
		return err
	}
	archive, err := openArchive(cfg)
	if err != nil {
		return err
	}
	pool, err := postgres.Connect(ctx, cfg.Database.URL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := ops.Cleanup(ctx, ops.CleanupConfig{
		Ledger: postgres.NewOpsStore(pool), Archive: archive, Required: requiredConsumers(cfg),
		ReplayWindow: cfg.Cleanup.ReplayWindow, BatchSize: cfg.Cleanup.BatchSize, DryRun: *dry,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	p := res.Plan
	fmt.Printf("boundary: archive through id %d, consumers covered through id %d (journal sequence %d), replay window %s (rows created before %s)\n",
		res.ArchiveThrough, res.CoveredThrough, res.CoveredSequence, cfg.Cleanup.ReplayWindow, p.Cutoff.UTC().Format("2006-01-02T15:04:05Z"))
	switch {
	case p.Rows == 0:
		fmt.Println("nothing to delete")
	case res.DryRun:
		fmt.Printf("dry run: would delete %d rows, ids %d..%d (journals up to sequence %d); %d covered rows stay inside the replay window\n",
			p.Rows, p.FirstID, p.LastID, p.JournalFloor, p.InsideWindow)
	default:
		fmt.Printf("deleted %d rows, ids %d..%d, in %d batches; %d covered rows stay inside the replay window\n",
			res.Deleted, res.DeletedFirstID, res.DeletedLastID, res.Batches, p.InsideWindow)
	}
	return nil
}
