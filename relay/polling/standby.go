package polling

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/posthorn/posthorn/relay/internal/relaymetrics"
	"github.com/posthorn/posthorn/relay/internal/standbygate"
)

// This file holds back publishing until the ledger's standbys have flushed
// what is about to be published (relay.standby_flush: required), so that a
// failover to a standby never promotes a ledger that lacks an event the
// world has already seen. Both relay modes use it.

// LSN is a WAL position: a byte offset into the write-ahead log.
type LSN = standbygate.LSN

// Standby is one physical standby streaming from the ledger's primary, as
// pg_stat_replication shows it.
type Standby = standbygate.Standby

// StandbyStatus is the primary's WAL insert position and its physical
// standbys, read in one statement.
type StandbyStatus = standbygate.Status

// StandbyProbe reads the ledger's physical standbys.
type StandbyProbe = standbygate.Probe

// Defaults of StandbyFlush.
const (
	StandbyPollMaxDefault   = standbygate.PollMaxDefault
	StandbyWarnAfterDefault = standbygate.WarnAfterDefault
)

// StandbyFlush configures the wait for the standbys. The zero value is off.
type StandbyFlush struct {
	// Required publishes a row only once Count of the standbys Names (any
	// physical standby when Names is empty) report its commit flushed.
	Required bool
	// Names are application_names of standbys that count; empty: any.
	Names []string
	// Count is how many of them must have flushed; 0 means all of Names,
	// or one when Names is empty.
	Count int
	// Probe reads the standbys: needed when Required, and used without it
	// to warn at start (CheckStandbys).
	Probe StandbyProbe
	// PollMax is the longest wait between two reads of the standbys'
	// positions (for the first 100 ms of a wait they are read every
	// millisecond).
	PollMax time.Duration
	// WarnAfter is how long a hold lasts before the relay logs it (then
	// once a minute while it lasts).
	WarnAfter time.Duration
}

func (s *StandbyFlush) setDefaults() {
	g := s.gate()
	s.Count, s.PollMax, s.WarnAfter = g.Count, g.PollMax, g.WarnAfter
}

// gate is s as its gate's configuration, defaulted.
func (s StandbyFlush) gate() standbygate.Config {
	return standbygate.Config{Names: s.Names, Count: s.Count, Probe: s.Probe, PollMax: s.PollMax, WarnAfter: s.WarnAfter}.WithDefaults()
}

// newStandbyGate returns the gate of s for a relay reporting through m, or
// nil when s is off. s must have passed validation.
func newStandbyGate(s StandbyFlush, m *relaymetrics.Metrics, log *slog.Logger) *standbygate.Gate {
	if !s.Required {
		return nil
	}
	return standbygate.New(s.gate(), m, log)
}

// Validate checks s as its relay will use it (zero fields defaulted); the
// error wraps ErrInvalidConfig and names the field.
func (s StandbyFlush) Validate() error {
	if !s.Required {
		return nil
	}
	s.setDefaults()
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case s.Probe == nil:
		return bad("StandbyFlush.Probe", "is nil, want the ledger's standby probe when Required")
	case s.Count < 1 || len(s.Names) > 0 && s.Count > len(s.Names):
		return bad("StandbyFlush.Count", "is %d, want 1 to the number of Names (%d)", s.Count, len(s.Names))
	}
	for i, n := range s.Names {
		if n == "" || slices.Index(s.Names, n) != i {
			return bad("StandbyFlush.Names", "holds %q twice or empty", n)
		}
	}
	return nil
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
	if cfg.Required && !canRead {
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
	case cfg.Required:
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
