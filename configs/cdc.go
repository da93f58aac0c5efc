package configs

import (
	"regexp"
	"time"
)

// CDC configures the relay's CDC mode (relay.mode: cdc): the replication
// slot and publication it streams the outbox through, and how it keeps an
// idle slot from retaining WAL.
type CDC struct {
	// Slot is the logical replication slot (one reader holds it at a time).
	Slot string `koanf:"slot"`
	// Publication is the publication on the outbox table; the relay creates
	// it (inserts only) when it is missing.
	Publication string `koanf:"publication"`
	// HeartbeatInterval is how often an idle relay emits a heartbeat message
	// so the slot advances past WAL written elsewhere.
	HeartbeatInterval time.Duration `koanf:"heartbeat_interval"`
	// StatusInterval is how often the confirmed position is reported to the
	// server even when it did not move; keep it below wal_sender_timeout.
	StatusInterval time.Duration `koanf:"status_interval"`
}

func defaultCDC() CDC {
	return CDC{
		Slot:              "posthorn_outbox",
		Publication:       "posthorn_outbox",
		HeartbeatInterval: 10 * time.Second,
		StatusInterval:    10 * time.Second,
	}
}

// pgIdent is what Posthorn accepts as a slot or publication name: a plain
// lower-case identifier, so it needs no quoting anywhere.
var pgIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (c CDC) validate() error {
	if !pgIdent.MatchString(c.Slot) {
		return fieldErr("relay.cdc.slot", "is %q, want lower-case letters, digits and _ (at most 63, not starting with a digit)", c.Slot)
	}
	if !pgIdent.MatchString(c.Publication) {
		return fieldErr("relay.cdc.publication", "is %q, want lower-case letters, digits and _ (at most 63, not starting with a digit)", c.Publication)
	}
	if err := positive("relay.cdc.heartbeat_interval", c.HeartbeatInterval); err != nil {
		return err
	}
	return positive("relay.cdc.status_interval", c.StatusInterval)
}
