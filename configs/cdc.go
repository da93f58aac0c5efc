package configs

import (
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/cdc"
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
		Slot:              cdc.SlotDefault,
		Publication:       cdc.PublicationDefault,
		HeartbeatInterval: cdc.HeartbeatIntervalDefault,
		StatusInterval:    cdc.StatusIntervalDefault,
	}
}

func (c CDC) validate() error {
	if !core.IsIdentifier(c.Slot) {
		return fieldErr("relay.cdc.slot", "is %q, want lower-case letters, digits and _ (at most 63, not starting with a digit)", c.Slot)
	}
	if !core.IsIdentifier(c.Publication) {
		return fieldErr("relay.cdc.publication", "is %q, want lower-case letters, digits and _ (at most 63, not starting with a digit)", c.Publication)
	}
	if err := positive("relay.cdc.heartbeat_interval", c.HeartbeatInterval); err != nil {
		return err
	}
	return positive("relay.cdc.status_interval", c.StatusInterval)
}
