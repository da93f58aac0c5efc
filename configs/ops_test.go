package configs

import (
	"strings"
	"testing"
	"time"
)

func TestOpsKeysDefaultsAndValidation(t *testing.T) {
	cfg := loadEnv(t)
	if cfg.Cleanup.ReplayWindow != 7*24*time.Hour || cfg.Cleanup.BatchSize != 1000 || cfg.Archive.SegmentRows != 10000 {
		t.Fatalf("defaults: %+v %+v", cfg.Cleanup, cfg.Archive)
	}
	cfg = loadEnv(t, "POSTHORN_ARCHIVE__DIR=/var/lib/posthorn/archive", "POSTHORN_CLEANUP__REPLAY_WINDOW=36h",
		"POSTHORN_CLEANUP__REQUIRED_CONSUMERS=balance-projection, audit-log")
	if cfg.Archive.Dir != "/var/lib/posthorn/archive" || cfg.Cleanup.ReplayWindow != 36*time.Hour || len(cfg.Cleanup.RequiredConsumers) != 2 {
		t.Fatalf("from env: %+v %+v", cfg.Archive, cfg.Cleanup)
	}
	refusedNamingKey(t, map[string]string{
		"POSTHORN_CLEANUP__BATCH_SIZE=0":       "cleanup.batch_size",
		"POSTHORN_CLEANUP__REPLAY_WINDOW=-1h":  "cleanup.replay_window",
		"POSTHORN_ARCHIVE__SEGMENT_ROWS=-5":    "archive.segment_rows",
		"POSTHORN_CLEANUP__BATCH_SIZE=1000000": "cleanup.batch_size",
	})
	if err := (Config{}).RequireArchiveDir(); err == nil || !strings.Contains(err.Error(), "archive.dir") {
		t.Errorf("RequireArchiveDir: %v", err)
	}
}
