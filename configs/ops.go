package configs

import (
	"fmt"
	"time"

	"github.com/posthorn/posthorn/ops"
)

// Archive configures `posthorn archive`: where covered outbox rows are
// written before cleanup may delete them.
type Archive struct {
	// Dir is the filesystem archive (segment files and manifest.json);
	// required by archive, cleanup and replays of cleaned ranges.
	Dir string `koanf:"dir"`
	// SegmentRows is the most outbox rows per segment file.
	SegmentRows int `koanf:"segment_rows"`
}

// Cleanup configures `posthorn cleanup`: the deletion boundary.
type Cleanup struct {
	// ReplayWindow is how long relayed rows stay in the outbox for replay
	// even when archived and covered.
	ReplayWindow time.Duration `koanf:"replay_window"`
	// BatchSize is the most rows deleted per transaction.
	BatchSize int `koanf:"batch_size"`
	// RequiredConsumers must each have verified coverage of a row before it
	// is archived or deleted; empty means every consumer reconcile reads
	// (reconcile.consumers, or the two example consumers).
	RequiredConsumers []string `koanf:"required_consumers"`
}

func defaultArchive() Archive { return Archive{SegmentRows: ops.DefaultSegmentRows} }

func defaultCleanup() Cleanup {
	return Cleanup{ReplayWindow: 7 * 24 * time.Hour, BatchSize: ops.DefaultBatchSize}
}

func (a Archive) validate() error {
	if a.SegmentRows < 1 || a.SegmentRows > 1_000_000 {
		return fieldErr("archive.segment_rows", "is %d, want 1 to 1000000", a.SegmentRows)
	}
	return nil
}

func (c Cleanup) validate() error {
	if c.ReplayWindow < 0 {
		return fieldErr("cleanup.replay_window", "must not be negative, is %s", c.ReplayWindow)
	}
	if c.BatchSize < 1 || c.BatchSize > 100_000 {
		return fieldErr("cleanup.batch_size", "is %d, want 1 to 100000", c.BatchSize)
	}
	for i, n := range c.RequiredConsumers {
		if n == "" {
			return fieldErr(fmt.Sprintf("cleanup.required_consumers[%d]", i), "is empty")
		}
	}
	return nil
}

// RequireArchiveDir reports a missing archive.dir.
func (c Config) RequireArchiveDir() error {
	if c.Archive.Dir == "" {
		return fieldErr("archive.dir", "is required (env POSTHORN_ARCHIVE__DIR)")
	}
	return nil
}
