package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrCleanupRefused is returned (wrapped, with the reason) when a condition
// for deleting is missing: archive coverage, a required consumer's
// coverage, or rows outside the replay window.
var ErrCleanupRefused = errors.New("cleanup refused")

// CleanupConfig configures Cleanup.
type CleanupConfig struct {
	Ledger CleanupStore
	// Archive is re-verified (VerifyRange) over the rows to delete before
	// anything goes; required.
	Archive      ArchiveStore
	Required     []string
	ReplayWindow time.Duration
	// BatchSize is the most rows deleted per transaction (default
	// DefaultBatchSize).
	BatchSize int
	DryRun    bool
}

// CleanupResult says what Cleanup deleted (or, dry, would delete).
type CleanupResult struct {
	DryRun          bool        `json:"dry_run"`
	ArchiveThrough  int64       `json:"archive_through"`
	CoveredThrough  int64       `json:"covered_through"`
	CoveredSequence int64       `json:"covered_sequence"`
	Plan            CleanupPlan `json:"plan"`
	Deleted         int64       `json:"deleted"`
	Batches         int         `json:"batches"`
	DeletedFirstID  int64       `json:"deleted_first_id,omitempty"`
	DeletedLastID   int64       `json:"deleted_last_id,omitempty"`
	// ArchiveProblems lists what the re-verification of the archive found
	// (cleanup then deletes nothing).
	ArchiveProblems []string `json:"archive_problems,omitempty"`
}

// Cleanup deletes the outbox rows that are relayed, inside every required
// consumer's verified coverage and the archive coverage, older than the
// replay window, and of journals at or below the journal floor, in
// batches of BatchSize rows per transaction. It refuses, wrapping
// ErrCleanupRefused with the reason, when there is no archive coverage, a
// required consumer has no coverage, or every candidate row is still
// inside the replay window, and (wrapping ErrArchiveCorrupt too) when the
// archive segments covering the rows to delete are missing or altered: it
// re-verifies them (VerifyRange) first, in a dry run too.
func Cleanup(ctx context.Context, cfg CleanupConfig) (CleanupResult, error) {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	res := CleanupResult{DryRun: cfg.DryRun}
	if cfg.Archive == nil {
		return res, fmt.Errorf("%w: the archive is needed to re-verify the segments of the rows to delete (archive.dir)", ErrCleanupRefused)
	}
	var err error
	if res.ArchiveThrough, err = cfg.Ledger.ArchiveThrough(ctx); err != nil {
		return res, err
	}
	if res.ArchiveThrough == 0 {
		return res, fmt.Errorf("%w: no archive coverage (run posthorn archive first)", ErrCleanupRefused)
	}
	low, err := requiredCoverage(ctx, cfg.Ledger, cfg.Required)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrCleanupRefused, err)
	}
	res.CoveredThrough, res.CoveredSequence = low.CoveredOutboxID, low.CutSequence
	through := min(res.ArchiveThrough, res.CoveredThrough)
	if res.Plan, err = cfg.Ledger.PlanCleanup(ctx, through, res.CoveredSequence, cfg.ReplayWindow); err != nil {
		return res, err
	}
	if res.Plan.Rows == 0 {
		if res.Plan.InsideWindow > 0 {
			return res, fmt.Errorf("%w: all %d archived and covered rows are inside the replay window of %s (cleanup.replay_window); none was created before %s",
				ErrCleanupRefused, res.Plan.InsideWindow, cfg.ReplayWindow, res.Plan.Cutoff.UTC().Format(time.RFC3339))
		}
		return res, nil // nothing left to delete
	}
	// Re-verify what the deletion relies on: the segments may have been
	// lost or altered since archive recorded them.
	problems, err := VerifyRange(ctx, cfg.Ledger, cfg.Archive, res.Plan.FirstID, res.Plan.LastID)
	if err != nil {
		return res, err
	}
	if len(problems) > 0 {
		res.ArchiveProblems = problems
		return res, fmt.Errorf("%w: %w: the archive segments of outbox ids %d..%d do not verify (%s); nothing deleted",
			ErrCleanupRefused, ErrArchiveCorrupt, res.Plan.FirstID, res.Plan.LastID, strings.Join(problems, "; "))
	}
	if cfg.DryRun {
		return res, nil
	}
	// The boundary is recorded before anything is deleted, so an
	// interrupted cleanup never leaves rows gone that replay would look for
	// in the outbox, or journals that reconciliation would miss events of.
	if err := cfg.Ledger.RecordCleanup(ctx, res.Plan.LastID, res.Plan.JournalFloor, 0); err != nil {
		return res, err
	}
	after := res.Plan.FirstID - 1
	for {
		n, last, err := cfg.Ledger.DeleteBatch(ctx, res.Plan, after, cfg.BatchSize)
		if err != nil {
			return res, err
		}
		if n == 0 {
			break
		}
		if res.DeletedFirstID == 0 {
			res.DeletedFirstID = after + 1
		}
		res.Deleted += n
		res.Batches++
		res.DeletedLastID, after = last, last
		if err := cfg.Ledger.RecordCleanup(context.WithoutCancel(ctx), 0, 0, n); err != nil {
			return res, err
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
	return res, nil
}
