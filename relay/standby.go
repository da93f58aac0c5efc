package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// This file is the vocabulary of the wait for the ledger's standbys
// (relay.standby_flush: required), which both modes hold each batch back
// with (relay/internal/standbygate), so that a failover to a standby never
// promotes a ledger that lacks an event the world has already seen.

// LSN is a WAL position: a byte offset into the write-ahead log.
type LSN uint64

// String is the LSN as PostgreSQL prints it, e.g. 16/B374D848.
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// Standby is one physical standby streaming from the ledger's primary, as
// pg_stat_replication shows it.
type Standby struct {
	// Name is its application_name (a standby's cluster_name, or what its
	// primary_conninfo says).
	Name string
	// State is streaming, catchup, startup, …
	State string
	// Flush is the WAL position the standby reported flushed to its disk;
	// 0 when unknown.
	Flush LSN
}

// StandbyStatus is the primary's WAL insert position and its physical
// standbys, read in one statement.
type StandbyStatus struct {
	// Insert is past the commit record of every transaction whose rows a
	// read before it could see (the insert position, not the write
	// position: with synchronous_commit off a commit is visible before it
	// is written).
	Insert   LSN
	Standbys []Standby
}

// StandbyProbe reads the ledger's physical standbys. Its methods are one
// short statement each and safe for concurrent use.
type StandbyProbe interface {
	// StandbyStatus reads the WAL insert position and the physical
	// standbys (WAL senders of logical replication, such as the CDC relay's
	// own, are not standbys).
	StandbyStatus(ctx context.Context) (StandbyStatus, error)
	// ReplicationSettings returns synchronous_standby_names and whether
	// this session may read the standbys' positions (pg_read_all_stats).
	ReplicationSettings(ctx context.Context) (syncNames string, canRead bool, err error)
}

// CheckStandbys reads the ledger's replication setup when a relay starts
// (nothing when cfg has no Probe). With Required it returns an error when
// this session cannot read the standbys' positions (the relay would be held
// for ever) and warns about each configured standby that is not connected.
// Without it, it warns when the ledger has physical standbys but neither
// synchronous replication nor Required keeps a failover from promoting a
// standby that lacks events already published.
func CheckStandbys(ctx context.Context, cfg StandbyFlush, log *slog.Logger) error {
	if cfg.Probe == nil {
		return nil
	}
	syncNames, canRead, err := cfg.Probe.ReplicationSettings(ctx)
	if err != nil {
		return fmt.Errorf("read the ledger's replication settings: %w", err)
	}
	if cfg.Required() && !canRead {
		return fmt.Errorf("standby flush is required, but the relay's database role cannot read the standbys' flush positions in pg_stat_replication: grant it pg_read_all_stats (`posthorn migrate --roles` does for posthorn_relay)")
	}
	st, err := cfg.Probe.StandbyStatus(ctx)
	if err != nil {
		return fmt.Errorf("read the ledger's standbys: %w", err)
	}
	names := make([]string, len(st.Standbys))
	for i, s := range st.Standbys {
		names[i] = s.Name
	}
	switch {
	case cfg.Required():
		for _, n := range cfg.Names {
			if !slices.Contains(names, n) {
				log.Warn("a standby named in relay.standby_names is not streaming from the ledger: the relay holds every batch until it is", "standby", n)
			}
		}
		if len(cfg.Names) == 0 && len(st.Standbys) == 0 {
			log.Warn("relay.standby_flush is required but the ledger has no standby streaming from it: the relay holds every batch until one is")
		}
	case len(st.Standbys) > 0 && strings.TrimSpace(syncNames) == "":
		log.Warn("the ledger has standbys but neither synchronous replication (synchronous_standby_names is empty) nor relay.standby_flush: required; a failover to a standby that missed the last postings promotes a ledger without events this relay already published",
			"standbys", strings.Join(names, ", "))
	}
	return nil
}
