package configs

import (
	"fmt"
	"regexp"

	"github.com/posthorn/posthorn/core"
)

// Outbox configures what the write path puts on the wire besides IDs,
// amounts and revisions.
type Outbox struct {
	// MetadataAllowlist names the posting metadata keys copied onto each of
	// the posting's events, as headers "meta_<key>". Default none: metadata
	// stays in the ledger (journals.metadata) and never reaches a sink.
	// Commands never carry metadata, only their declared payload.
	MetadataAllowlist []string `koanf:"metadata_allowlist"`
	// MetadataMaxBytes bounds the allow-listed metadata of one posting
	// (keys plus values, in bytes); a posting above it is refused naming
	// the field, and nothing is written.
	MetadataMaxBytes int `koanf:"metadata_max_bytes"`
}

func defaultOutbox() Outbox {
	return Outbox{MetadataMaxBytes: core.DefaultMetadataMaxBytes}
}

// metadataAllowKey is the metadata key syntax of the Posting API (core).
var metadataAllowKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func (o Outbox) validate() error {
	seen := make(map[string]bool, len(o.MetadataAllowlist))
	for i, k := range o.MetadataAllowlist {
		key := fmt.Sprintf("outbox.metadata_allowlist[%d]", i)
		if !metadataAllowKey.MatchString(k) {
			return fieldErr(key, "is %.80q, want a metadata key (letters, digits, '.', '_', '-'; at most 64)", k)
		}
		if seen[k] {
			return fieldErr(key, "repeats %q", k)
		}
		seen[k] = true
	}
	if o.MetadataMaxBytes < 1 || o.MetadataMaxBytes > 16384 {
		return fieldErr("outbox.metadata_max_bytes", "is %d, want 1 to 16384", o.MetadataMaxBytes)
	}
	return nil
}
