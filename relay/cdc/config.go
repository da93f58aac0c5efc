package cdc

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay/polling"
)

// Defaults of Config.
const (
	SlotDefault              = "posthorn_outbox"
	PublicationDefault       = "posthorn_outbox"
	BatchLingerDefault       = 2 * time.Millisecond
	StatusIntervalDefault    = 10 * time.Second
	HeartbeatIntervalDefault = 10 * time.Second
)

// Config configures a CDC Relay. Zero fields take the defaults above or
// the polling relay's (polling.BatchSizeDefault, polling.LeaseTTLDefault, …).
type Config struct {
	// Owner names this relay in the slot's lease; default host name and
	// process ID. Two running relays must not share a name.
	Owner string
	// SinkName labels the published and latency metrics (e.g. kafka).
	SinkName string
	// ExactlyOnce publishes through the sink's per-shard transactions, as
	// the polling relay does (delivery.Fences); New refuses a sink that is
	// not a polling.FencedSink.
	ExactlyOnce bool
	// Slot is the logical replication slot; Publication the publication on
	// the outbox table (created when missing). Both are plain identifiers.
	Slot        string
	Publication string
	// BatchSize is the most rows published at once.
	BatchSize int
	// BatchLinger is the longest a received, committed row waits for more
	// rows to share its batch.
	BatchLinger time.Duration
	// LeaseTTL is how long the slot lease lasts without renewal; a standby
	// relay takes over once it expires.
	LeaseTTL time.Duration
	// RetryInitial and RetryMax bound the backoff after a retryable failure.
	RetryInitial time.Duration
	RetryMax     time.Duration
	// ParkAfterAttempts and ParkAfter park the aggregate of a record that
	// keeps failing retryably while the sink takes others, as in the
	// polling relay (polling.Config, delivery.StuckTracker): zero takes the
	// default, negative turns the bound off.
	ParkAfterAttempts int
	ParkAfter         time.Duration
	// StatusInterval is how often the confirmed position is sent to the
	// server even when it did not move (keep it well below the server's
	// wal_sender_timeout).
	StatusInterval time.Duration
	// HeartbeatInterval is how often an idle relay emits a heartbeat
	// message, so the slot can advance past WAL others write. Between
	// heartbeats it also confirms the server's WAL end from keepalives when
	// nothing is in flight. Negative turns both off (the negative control of
	// the idle-WAL test; never in production).
	HeartbeatInterval time.Duration
	// StatsInterval is how often the backlog and slot gauges are refreshed.
	StatsInterval time.Duration
	// StandbyFlush holds each transaction until the ledger's standbys have
	// flushed its commit (polling.StandbyFlush); the zero value is off.
	StandbyFlush polling.StandbyFlush
	// History, when set, holds every transaction back while the ledger
	// does not run on the history an operator accepted (polling.HistoryGate).
	History polling.HistoryGate
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Hooks are injection points for tests; nil in production.
	Hooks *Hooks
}

// Hooks let tests crash and stall the relay at exact points and switch its
// protections off for negative controls.
type Hooks struct {
	// BeforePublish runs before a batch is published (blocking simulates a
	// stall); a non-nil error is a crash before the publish.
	BeforePublish func(batch []core.Envelope) error
	// AfterAck runs after the sink ACKed a batch, before its marker. A
	// non-nil error is a crash: no marker, no confirmation, no lease
	// release.
	AfterAck func(batch []core.Envelope) error
	// AfterMark runs after the marker, before the position is confirmed to
	// the server; a non-nil error is a crash.
	AfterMark func(batch []core.Envelope) error
	// BeforeSlotCreate runs before a (new) slot is created.
	BeforeSlotCreate func()
	// SkipCatchUp skips reading the outbox before streaming (at start and
	// after a slot was lost): the negative control of slot-loss recovery.
	SkipCatchUp bool
	// UnsafeConfirmOnReceipt confirms a transaction's position as soon as it
	// is received, before the sink ACK: the negative control of the crash
	// test.
	UnsafeConfirmOnReceipt bool
	// UnsafeSkipPositions fences for exactly-once without marking what the
	// committed transactions hold: the negative control of that read.
	UnsafeSkipPositions bool
	// UnsafeSilentReader keeps the stream's reader from answering the
	// server while the relay delivers: the negative control of the WAL
	// sender timeout test.
	UnsafeSilentReader bool
}

func (c *Config) setDefaults() {
	if c.Owner == "" {
		c.Owner = polling.DefaultOwner()
	}
	c.SinkName = cmp.Or(c.SinkName, "sink")
	c.Slot = cmp.Or(c.Slot, SlotDefault)
	c.Publication = cmp.Or(c.Publication, PublicationDefault)
	c.BatchSize = cmp.Or(c.BatchSize, polling.BatchSizeDefault)
	c.BatchLinger = cmp.Or(c.BatchLinger, BatchLingerDefault)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, polling.LeaseTTLDefault)
	c.RetryInitial = cmp.Or(c.RetryInitial, polling.RetryInitialDefault)
	c.RetryMax = cmp.Or(c.RetryMax, polling.RetryMaxDefault)
	c.ParkAfterAttempts = cmp.Or(c.ParkAfterAttempts, polling.ParkAfterAttemptsDefault)
	c.ParkAfter = cmp.Or(c.ParkAfter, polling.ParkAfterDefault)
	c.StatusInterval = cmp.Or(c.StatusInterval, StatusIntervalDefault)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, HeartbeatIntervalDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, polling.StatsIntervalDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// ErrInvalidConfig wraps every validation error of Config.
var ErrInvalidConfig = errors.New("invalid CDC relay config")

func (c *Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case !core.IsIdentifier(c.Slot):
		return bad("Slot", "is %q, want lower-case letters, digits and _ (at most 63)", c.Slot)
	case !core.IsIdentifier(c.Publication):
		return bad("Publication", "is %q, want lower-case letters, digits and _ (at most 63)", c.Publication)
	case c.BatchSize < 1 || c.BatchSize > 100000:
		return bad("BatchSize", "is %d, want 1 to 100000", c.BatchSize)
	case c.BatchLinger < 0:
		return bad("BatchLinger", "is %s, want positive", c.BatchLinger)
	case c.LeaseTTL < 100*time.Millisecond:
		return bad("LeaseTTL", "is %s, want at least 100ms", c.LeaseTTL)
	case c.RetryInitial < 0 || c.RetryMax < c.RetryInitial:
		return bad("RetryMax", "is %s, want at least RetryInitial (%s)", c.RetryMax, c.RetryInitial)
	case c.StatusInterval <= 0:
		return bad("StatusInterval", "is %s, want positive", c.StatusInterval)
	case c.StatsInterval < 0:
		return bad("StatsInterval", "is %s, want positive", c.StatsInterval)
	}
	return c.StandbyFlush.Validate()
}
