package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/core"
)

// The relay's modes (Settings.Mode, relay.mode).
const (
	ModePolling = "polling"
	ModeCDC     = "cdc"
)

// Defaults of Settings, in the order of its fields. Defaults returns the
// ones with a configuration key; WithDefaults fills every zero field but
// the park bounds, whose zero turns them off.
const (
	ModeDefault              = ModePolling
	BatchSizeDefault         = 5000
	PollIntervalDefault      = 500 * time.Millisecond
	LeaseTTLDefault          = 10 * time.Second
	ParkAfterAttemptsDefault = 30
	ParkAfterDefault         = 5 * time.Minute
	MinPollIntervalDefault   = 10 * time.Millisecond
	RetryInitialDefault      = 100 * time.Millisecond
	RetryMaxDefault          = 10 * time.Second
	StatsIntervalDefault     = 2 * time.Second
	SinkNameDefault          = "sink"
)

// Settings configure a relay of either mode (polling.New, cdc.New): the
// keys under relay. in the configuration, which configs decodes straight
// into this type (the koanf tags), and the fields only Go callers set
// (koanf:"-"). Validate checks them and names the key.
//
// A zero field takes its default when a relay is built (WithDefaults),
// except ParkAfterAttempts and ParkAfter, whose zero turns the bound off as
// it does in the file; Defaults has every key's default.
type Settings struct {
	// Mode is polling (package relay/polling) or cdc (relay/cdc): which
	// relay `posthorn relay` runs. The modes themselves ignore it.
	Mode string `koanf:"mode"`
	// BatchSize is the most rows read (polling) or published (both) at
	// once.
	BatchSize int `koanf:"batch_size"`
	// PollInterval is the longest an idle polling relay waits when no
	// notification arrives; after an empty read it waits MinPollInterval,
	// doubling up to PollInterval, so a quiet relay costs little and a
	// notification (or a full batch) wakes it at once.
	PollInterval time.Duration `koanf:"poll_interval"`
	// LeaseTTL is how long a lease (a shard's, or the CDC slot's) lasts
	// without renewal; a relay stalled for longer loses it to another.
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// Owner names this relay in leases; default host name and process ID
	// (DefaultOwner). Two running relays must not share a name.
	Owner string `koanf:"owner"`
	// ParkAfterAttempts and ParkAfter bound how long one record may keep
	// failing retryably while the sink takes other records before its
	// aggregate is parked with the last error as reason: after that many
	// attempts, or that long, whichever comes first. 0 turns a bound off;
	// both off is the old behaviour, where one such record backs off every
	// batch for ever. A sink-wide outage (every record failing) never
	// parks: it only backs off.
	ParkAfterAttempts int           `koanf:"park_after_attempts"`
	ParkAfter         time.Duration `koanf:"park_after"`
	// StandbyFlush holds every batch until the ledger's standbys have
	// flushed its commits. Its keys sit directly under relay. (squash for
	// the decoder, flatten for the reader of the defaults).
	StandbyFlush StandbyFlush `koanf:",squash,flatten"`
	// CDC holds what only the CDC mode reads (relay.cdc.*).
	CDC CDC `koanf:"cdc"`

	// MinPollInterval is the polling relay's first wait after an empty
	// read (default MinPollIntervalDefault, at most PollInterval).
	MinPollInterval time.Duration `koanf:"-"`
	// RetryInitial and RetryMax bound the exponential backoff (with
	// jitter) after a retryable sink failure.
	RetryInitial time.Duration `koanf:"-"`
	RetryMax     time.Duration `koanf:"-"`
	// StatsInterval is how often the backlog, open-transaction (and slot)
	// gauges are refreshed; a relay waits longer while reading them is
	// slow.
	StatsInterval time.Duration `koanf:"-"`
	// SinkName labels the published and latency metrics (sink.kind).
	SinkName string `koanf:"-"`
	// ExactlyOnce publishes through the sink's per-shard transactions
	// (sink.kafka.exactly_once); New refuses a sink that is not a
	// FencedSink.
	ExactlyOnce bool `koanf:"-"`
	// History, when set, holds publishing back while the ledger does not
	// run on the history an operator accepted; nil is no check (a store
	// without a server history, as in unit tests).
	History HistoryGate `koanf:"-"`
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger `koanf:"-"`
	// Registerer receives the relay's metrics; nil means none are
	// registered.
	Registerer prometheus.Registerer `koanf:"-"`
}

// Defaults of CDC.
const (
	SlotDefault              = "posthorn_outbox"
	PublicationDefault       = "posthorn_outbox"
	HeartbeatIntervalDefault = 10 * time.Second
	StatusIntervalDefault    = 10 * time.Second
	BatchLingerDefault       = 2 * time.Millisecond
)

// CDC configures the relay's CDC mode (relay.mode: cdc): the replication
// slot and publication it streams the outbox through, and how it keeps an
// idle slot from retaining WAL.
type CDC struct {
	// Slot is the logical replication slot (one reader holds it at a
	// time); Publication the publication on the outbox table, created
	// (inserts only) when missing. Both are plain identifiers.
	Slot        string `koanf:"slot"`
	Publication string `koanf:"publication"`
	// HeartbeatInterval is how often an idle relay emits a heartbeat
	// message, so the slot advances past WAL others write. Between
	// heartbeats it also confirms the server's WAL end from keepalives
	// when nothing is in flight.
	HeartbeatInterval time.Duration `koanf:"heartbeat_interval"`
	// StatusInterval is how often the confirmed position is sent to the
	// server even when it did not move (keep it well below the server's
	// wal_sender_timeout).
	StatusInterval time.Duration `koanf:"status_interval"`
	// BatchLinger is the longest a received, committed row waits for more
	// rows to share its batch.
	BatchLinger time.Duration `koanf:"-"`
}

// Policies of StandbyFlush.Policy (relay.standby_flush).
const (
	StandbyOff      = "off"
	StandbyRequired = "required"
)

// Defaults of StandbyFlush.
const (
	StandbyPollMaxDefault   = 20 * time.Millisecond
	StandbyWarnAfterDefault = 5 * time.Second
)

// StandbyFlush configures the wait for the ledger's standbys. The zero
// value is off.
type StandbyFlush struct {
	// Policy is off or required: with required a row is published only
	// once Count of the standbys Names (any physical standby when Names is
	// empty) report its commit flushed, so a failover never promotes a
	// standby lacking an event already published.
	Policy string `koanf:"standby_flush"`
	// Names are application_names of standbys that count; empty: any.
	Names []string `koanf:"standby_names"`
	// Count is how many of them must have flushed; 0 means all of Names,
	// or one when Names is empty.
	Count int `koanf:"standby_count"`
	// Probe reads the standbys: needed when required, and used without it
	// to warn at start (CheckStandbys).
	Probe StandbyProbe `koanf:"-"`
	// PollMax is the longest wait between two reads of the standbys'
	// positions (for the first 100 ms of a wait they are read every
	// millisecond).
	PollMax time.Duration `koanf:"-"`
	// WarnAfter is how long a hold lasts before the relay logs it (then
	// once a minute while it lasts).
	WarnAfter time.Duration `koanf:"-"`
}

// Required reports whether the relay waits for the standbys.
func (s StandbyFlush) Required() bool { return s.Policy == StandbyRequired }

// Defaults returns the settings with every configuration key at its
// default: the relay section of configs' defaults, and a Go caller's
// starting point when it wants the configuration's behaviour (the park
// bounds on).
func Defaults() Settings {
	return Settings{
		Mode:              ModeDefault,
		BatchSize:         BatchSizeDefault,
		PollInterval:      PollIntervalDefault,
		LeaseTTL:          LeaseTTLDefault,
		ParkAfterAttempts: ParkAfterAttemptsDefault,
		ParkAfter:         ParkAfterDefault,
		StandbyFlush:      StandbyFlush{Policy: StandbyOff},
		CDC: CDC{
			Slot:              SlotDefault,
			Publication:       PublicationDefault,
			HeartbeatInterval: HeartbeatIntervalDefault,
			StatusInterval:    StatusIntervalDefault,
		},
	}
}

// DefaultOwner is the Owner a relay of either mode takes when none is set:
// the host name and the process ID.
func DefaultOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// WithDefaults returns s with every zero field but the park bounds set to
// its default.
func (s Settings) WithDefaults() Settings {
	s.Mode = cmp.Or(s.Mode, ModeDefault)
	if s.Owner == "" {
		s.Owner = DefaultOwner()
	}
	s.SinkName = cmp.Or(s.SinkName, SinkNameDefault)
	s.BatchSize = cmp.Or(s.BatchSize, BatchSizeDefault)
	s.PollInterval = cmp.Or(s.PollInterval, PollIntervalDefault)
	if s.MinPollInterval == 0 {
		s.MinPollInterval = min(MinPollIntervalDefault, s.PollInterval)
	}
	s.LeaseTTL = cmp.Or(s.LeaseTTL, LeaseTTLDefault)
	s.RetryInitial = cmp.Or(s.RetryInitial, RetryInitialDefault)
	s.RetryMax = cmp.Or(s.RetryMax, RetryMaxDefault)
	s.StatsInterval = cmp.Or(s.StatsInterval, StatsIntervalDefault)
	s.StandbyFlush = s.StandbyFlush.withDefaults()
	s.CDC.Slot = cmp.Or(s.CDC.Slot, SlotDefault)
	s.CDC.Publication = cmp.Or(s.CDC.Publication, PublicationDefault)
	s.CDC.HeartbeatInterval = cmp.Or(s.CDC.HeartbeatInterval, HeartbeatIntervalDefault)
	s.CDC.StatusInterval = cmp.Or(s.CDC.StatusInterval, StatusIntervalDefault)
	s.CDC.BatchLinger = cmp.Or(s.CDC.BatchLinger, BatchLingerDefault)
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return s
}

func (s StandbyFlush) withDefaults() StandbyFlush {
	s.Policy = cmp.Or(s.Policy, StandbyOff)
	if s.Count == 0 {
		s.Count = max(len(s.Names), 1)
	}
	s.PollMax = cmp.Or(s.PollMax, StandbyPollMaxDefault)
	s.WarnAfter = cmp.Or(s.WarnAfter, StandbyWarnAfterDefault)
	return s
}

// ErrInvalidConfig is wrapped by every error of Validate and of the
// modes' New about their settings.
var ErrInvalidConfig = errors.New("invalid relay config")

// FieldError is a setting that does not validate. Key is its
// configuration key below relay. (batch_size, cdc.slot,
// standby_names[1]), or the Go field's name for a setting without one
// (RetryMax); configs reports it as relay.<Key>.
type FieldError struct {
	Key string
	// Msg says what is wrong: "is 0, want 1 to 100000".
	Msg string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s %s", ErrInvalidConfig, e.Key, e.Msg) }

// Unwrap returns ErrInvalidConfig.
func (e *FieldError) Unwrap() error { return ErrInvalidConfig }

func bad(key, format string, args ...any) error {
	return &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks s as given, the way the configuration gives it: a key
// whose zero is no valid value (batch_size: 0) is refused, while a field
// without a key takes its default when zero. The first problem is
// returned as a *FieldError naming the key. A relay's New fills the
// defaults first (WithDefaults) and checks the standby probe besides
// (Checked).
func (s Settings) Validate() error {
	switch {
	case s.Mode != ModePolling && s.Mode != ModeCDC:
		return bad("mode", "is %q, want polling or cdc", s.Mode)
	case s.BatchSize < 1 || s.BatchSize > 100000:
		return bad("batch_size", "is %d, want 1 to 100000", s.BatchSize)
	case s.PollInterval <= 0:
		return bad("poll_interval", "must be positive, is %s", s.PollInterval)
	case s.MinPollInterval < 0 || s.MinPollInterval > s.PollInterval:
		return bad("MinPollInterval", "is %s, want 0 < MinPollInterval <= poll_interval (%s)", s.MinPollInterval, s.PollInterval)
	case s.LeaseTTL < 100*time.Millisecond:
		return bad("lease_ttl", "is %s, want at least 100ms", s.LeaseTTL)
	case s.ParkAfterAttempts < 0 || s.ParkAfterAttempts > 1_000_000:
		return bad("park_after_attempts", "is %d, want 0 (off) to 1000000", s.ParkAfterAttempts)
	case s.ParkAfter < 0:
		return bad("park_after", "must not be negative (0 turns it off), is %s", s.ParkAfter)
	case s.RetryInitial < 0 || s.RetryMax != 0 && s.RetryMax < s.RetryInitial:
		return bad("RetryMax", "is %s, want at least RetryInitial (%s)", s.RetryMax, s.RetryInitial)
	case s.StatsInterval < 0:
		return bad("StatsInterval", "is %s, want positive", s.StatsInterval)
	}
	if err := s.StandbyFlush.validate(); err != nil {
		return err
	}
	return s.CDC.validate()
}

func (s StandbyFlush) validate() error {
	if s.Policy != StandbyOff && s.Policy != StandbyRequired {
		return bad("standby_flush", "is %q, want off or required", s.Policy)
	}
	for i, n := range s.Names {
		// An application_name is at most 63 bytes of printable ASCII (the
		// server replaces anything else with '?').
		if n == "" || len(n) > 63 || strings.IndexFunc(n, func(c rune) bool { return c < 0x20 || c > 0x7e }) >= 0 {
			return bad(fmt.Sprintf("standby_names[%d]", i), "is %q, want 1 to 63 printable ASCII characters (a standby's application_name)", n)
		}
		if slices.Index(s.Names, n) != i {
			return bad(fmt.Sprintf("standby_names[%d]", i), "names %q twice", n)
		}
	}
	if s.Count < 0 || len(s.Names) > 0 && s.Count > len(s.Names) {
		return bad("standby_count", "is %d, want 0 (all of relay.standby_names, or one standby when it is empty) to the number of relay.standby_names (%d)", s.Count, len(s.Names))
	}
	if s.PollMax < 0 || s.WarnAfter < 0 {
		return bad("StandbyFlush.PollMax", "and WarnAfter must not be negative, are %s and %s", s.PollMax, s.WarnAfter)
	}
	return nil
}

func (c CDC) validate() error {
	switch {
	case !core.IsIdentifier(c.Slot):
		return bad("cdc.slot", "is %q, want lower-case letters, digits and _ (at most 63, not starting with a digit)", c.Slot)
	case !core.IsIdentifier(c.Publication):
		return bad("cdc.publication", "is %q, want lower-case letters, digits and _ (at most 63, not starting with a digit)", c.Publication)
	case c.HeartbeatInterval <= 0:
		return bad("cdc.heartbeat_interval", "must be positive, is %s", c.HeartbeatInterval)
	case c.StatusInterval <= 0:
		return bad("cdc.status_interval", "must be positive, is %s", c.StatusInterval)
	case c.BatchLinger < 0:
		return bad("CDC.BatchLinger", "is %s, want positive", c.BatchLinger)
	}
	return nil
}

// Checked returns s as a relay runs it: its zero fields defaulted
// (WithDefaults), validated, and with a standby probe when the standbys
// are required. Both modes' New call it.
func (s Settings) Checked() (Settings, error) {
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		return s, err
	}
	if s.StandbyFlush.Required() && s.StandbyFlush.Probe == nil {
		return s, bad("StandbyFlush.Probe", "is nil, want the ledger's standby probe when standby_flush is required")
	}
	return s, nil
}
