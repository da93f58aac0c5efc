package bridge

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// This file holds back publishing until the ledger's standbys have flushed
// what is about to be published (relay.standby_flush: required), so that a
// failover to a standby never promotes a ledger that lacks an event the
// world has already seen. Both relay modes use it.

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
	// StandbyStatus reads the WAL insert position and the physical standbys
	// (WAL senders of logical replication, such as the CDC relay's own, are
	// not standbys).
	StandbyStatus(ctx context.Context) (StandbyStatus, error)
	// ReplicationSettings returns synchronous_standby_names and whether
	// this session may read the standbys' positions (pg_read_all_stats).
	ReplicationSettings(ctx context.Context) (syncNames string, canRead bool, err error)
}

// Defaults of StandbyFlush.
const (
	StandbyPollMaxDefault   = 20 * time.Millisecond
	StandbyWarnAfterDefault = 5 * time.Second
)

// standbyQuickPolls is how long a wait reads the standbys' positions every
// millisecond before it backs off.
const standbyQuickPolls = 100 * time.Millisecond

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
	if s.Count == 0 {
		s.Count = max(len(s.Names), 1)
	}
	s.PollMax = cmp.Or(s.PollMax, StandbyPollMaxDefault)
	s.WarnAfter = cmp.Or(s.WarnAfter, StandbyWarnAfterDefault)
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

// StandbyGate holds batches back until enough standbys have flushed them.
// It is owned by one relay loop: not safe for concurrent use.
type StandbyGate struct {
	cfg       StandbyFlush
	m         *metrics
	log       *slog.Logger
	heldSince time.Time // zero: not held
	warned    time.Time // when the current hold was last logged
}

// NewStandbyGate returns the gate of cfg for a relay reporting through m,
// or nil when cfg is off. cfg must have passed Config validation.
func NewStandbyGate(cfg StandbyFlush, m *Metrics, log *slog.Logger) *StandbyGate {
	if !cfg.Required {
		return nil
	}
	cfg.setDefaults()
	return &StandbyGate{cfg: cfg, m: m.m, log: log}
}

// Wait returns true once enough standbys have flushed WAL up to target;
// a target of 0 means the primary's WAL insert position at the first read,
// which is past the commit of every row read before the call. It returns
// false when until passes first (the caller renews its leases and comes
// back), or when life stops or ctx ends; an error when the standbys cannot
// be read. It returns the target it waited for. While it waits the gauge
// posthorn_relay_held_by_standby_seconds shows for how long the relay has
// been held, and a hold longer than WarnAfter is logged.
func (g *StandbyGate) Wait(ctx context.Context, life *Lifecycle, target LSN, until time.Time) (LSN, bool, error) {
	start := time.Now()
	poll := 250 * time.Microsecond
	for {
		st, err := g.cfg.Probe.StandbyStatus(ctx)
		if err != nil {
			return target, false, fmt.Errorf("read the standbys' flush positions (relay.standby_flush: required): %w", err)
		}
		if target == 0 {
			target = st.Insert
		}
		flushed, held := g.flushed(st, target)
		if flushed {
			g.release(time.Since(start))
			return target, true, nil
		}
		g.hold(target, held)
		if !time.Now().Add(poll).Before(until) || life.Stopping() || ctx.Err() != nil {
			return target, false, nil
		}
		life.Sleep(ctx, poll)
		// A healthy standby reports its flush within milliseconds: look
		// again every millisecond at first (a longer step is added to
		// every batch's latency), then back off towards PollMax.
		if time.Since(start) < standbyQuickPolls {
			poll = min(2*poll, time.Millisecond)
		} else {
			poll = min(2*poll, g.cfg.PollMax)
		}
	}
}

// flushed reports whether Count of the standbys that count have flushed
// target; if not, it describes what holds the relay back.
func (g *StandbyGate) flushed(st StandbyStatus, target LSN) (bool, []any) {
	var ok int
	var seen, behind []string
	for _, s := range st.Standbys {
		if len(g.cfg.Names) > 0 && !slices.Contains(g.cfg.Names, s.Name) {
			continue
		}
		seen = append(seen, s.Name)
		if s.Flush >= target {
			ok++
		} else {
			behind = append(behind, fmt.Sprintf("%q state %s flushed to %s", s.Name, s.State, s.Flush))
		}
	}
	if ok >= g.cfg.Count {
		return true, nil
	}
	var absent []string
	for _, n := range g.cfg.Names {
		if !slices.Contains(seen, n) {
			absent = append(absent, fmt.Sprintf("%q", n))
		}
	}
	return false, []any{"need", g.cfg.Count, "flushed", ok, "wal_position", target.String(),
		"behind", strings.Join(behind, "; "), "not_connected", strings.Join(absent, ", ")}
}

func (g *StandbyGate) hold(target LSN, why []any) {
	now := time.Now()
	if g.heldSince.IsZero() {
		g.heldSince = now
	}
	held := now.Sub(g.heldSince)
	g.m.heldByStandby.Set(held.Seconds())
	if held >= g.cfg.WarnAfter && now.Sub(g.warned) >= time.Minute {
		g.warned = now
		g.log.Warn("relay held back by the ledger's standbys: nothing is published until enough of them have flushed it (relay.standby_flush: required); a standby that is down or lagging holds the relay until it catches up",
			append([]any{"held_for", held.Round(time.Millisecond).String()}, why...)...)
	}
}

func (g *StandbyGate) release(waited time.Duration) {
	g.m.standbyWait.Observe(waited.Seconds())
	if g.heldSince.IsZero() {
		return
	}
	if !g.warned.IsZero() {
		g.log.Info("the standbys caught up; publishing again", "held_for", time.Since(g.heldSince).Round(time.Millisecond).String())
	}
	g.heldSince, g.warned = time.Time{}, time.Time{}
	g.m.heldByStandby.Set(0)
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
