package configs

import (
	"strings"
	"testing"

	"github.com/posthorn/posthorn/core"
)

func TestOutboxKeysDefaultsAndValidation(t *testing.T) {
	cfg := loadEnv(t)
	if len(cfg.Outbox.MetadataAllowlist) != 0 || cfg.Outbox.MetadataMaxBytes != core.DefaultMetadataMaxBytes {
		t.Fatalf("defaults: %+v (want no metadata on the wire)", cfg.Outbox)
	}
	cfg = loadEnv(t, "POSTHORN_OUTBOX__METADATA_ALLOWLIST=reference, order.id", "POSTHORN_OUTBOX__METADATA_MAX_BYTES=256")
	if strings.Join(cfg.Outbox.MetadataAllowlist, "|") != "reference|order.id" || cfg.Outbox.MetadataMaxBytes != 256 {
		t.Fatalf("from env: %+v", cfg.Outbox)
	}
	refusedNamingKey(t, map[string]string{
		"POSTHORN_OUTBOX__METADATA_ALLOWLIST=ok,bad key": "outbox.metadata_allowlist[1]",
		"POSTHORN_OUTBOX__METADATA_ALLOWLIST=a,a":        "outbox.metadata_allowlist[1]",
		"POSTHORN_OUTBOX__METADATA_ALLOWLIST=-lead":      "outbox.metadata_allowlist[0]",
		"POSTHORN_OUTBOX__METADATA_MAX_BYTES=0":          "outbox.metadata_max_bytes",
		"POSTHORN_OUTBOX__METADATA_MAX_BYTES=100000":     "outbox.metadata_max_bytes",
	})
}
