package polling

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/core"
)

// Defaults of Config.
const (
	BatchSizeDefault       = 5000
	PollIntervalDefault    = 500 * time.Millisecond
	MinPollIntervalDefault = 10 * time.Millisecond
	LeaseTTLDefault        = 10 * time.Second
	RetryInitialDefault    = 100 * time.Millisecond
	RetryMaxDefault        = 10 * time.Second
	StatsIntervalDefault   = 2 * time.Second
)

// Defaults of the retry-park policy (Config.ParkAfterAttempts,
// Config.ParkAfter).
const (
	ParkAfterAttemptsDefault = 30
	ParkAfterDefault         = 5 * time.Minute
)

// Config configures a Relay. Zero fields take the defaults above.
type Config struct {
	// Owner names this relay in leases; default host name and process ID.
	// Two running relays must not share a name.
	Owner string
	// SinkName labels the published and latency metrics (e.g. kafka).
	SinkName string
	// ExactlyOnce publishes through the sink's per-shard transactions
	// (exactly_once.go); New refuses a sink that is not a FencedSink.
	ExactlyOnce bool
	// BatchSize is the most rows read and published at once.
	BatchSize int
	// PollInterval is the longest an idle relay waits when no notification
	// arrives; after an empty read it waits MinPollInterval, doubling up to
	// PollInterval, so a quiet relay costs little and a notification (or a
	// full batch) wakes it at once.
	PollInterval    time.Duration
	MinPollInterval time.Duration
	// LeaseTTL is how long a shard lease lasts without renewal.
	LeaseTTL time.Duration
	// RetryInitial and RetryMax bound the exponential backoff (with jitter)
	// after a retryable sink failure.
	RetryInitial time.Duration
	RetryMax     time.Duration
	// ParkAfterAttempts and ParkAfter bound how long one record may keep
	// failing retryably while the sink takes other records before its
	// aggregate is parked (see StuckTracker): after that many attempts, or
	// that long, whichever comes first. Zero takes the default
	// (ParkAfterAttemptsDefault, ParkAfterDefault); negative turns that
	// bound off; both off is the old behaviour, where one such record backs
	// off every batch of the relay for ever.
	ParkAfterAttempts int
	ParkAfter         time.Duration
	// StatsInterval is how often the backlog and open-transaction gauges are
	// refreshed (the polling relay waits longer while reading them is slow,
	// see refreshStats).
	StatsInterval time.Duration
	// StandbyFlush holds every batch until the ledger's standbys have
	// flushed its commits (internal/standbygate); the zero value is off.
	StandbyFlush StandbyFlush
	// History, when set, holds publishing back while the ledger does not
	// run on the history an operator accepted (history.go); nil is no
	// check (a store without a server history, as in unit tests).
	History HistoryGate
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Hooks are injection points for tests; nil in production.
	Hooks *Hooks
}

// Hooks let tests stall, crash and misorder the relay at exact points.
type Hooks struct {
	// BeforePublish runs after a batch is read and before the lease check
	// that precedes publishing; blocking in it simulates a stalled relay.
	BeforePublish func(batch []core.Envelope)
	// AfterAck runs after the sink ACKed a batch and before the marker is
	// written. A non-nil error simulates a crash: the relay stops at once,
	// writes no marker and releases no lease.
	AfterAck func(batch []core.Envelope) error
	// BeforeMarker runs right before the marker of an ACKed batch is written
	// (after AfterAck); blocking in it lets another relay take the leases.
	BeforeMarker func()
	// UnsafeOrderByXID reads rows in transaction-ID order: the negative
	// control of the ordering test. Never set it outside tests.
	UnsafeOrderByXID bool
	// UnsafeCursor makes the relay remember the largest id it has read and
	// drop every row at or below it, as a "position > last" reader does:
	// the negative control of the late-commit test (a row whose
	// transaction commits late is stepped over for good). Never set it
	// outside tests.
	UnsafeCursor bool
	// UnsafeMarkBeforeAck writes the marker before publishing: the negative
	// control of the fault suite (a crash or a failed publish after the
	// marker loses the batch). Never set it outside tests.
	UnsafeMarkBeforeAck bool
	// UnsafeSkipPositions fences a shard for exactly-once but does not mark
	// the rows its committed transactions hold: the negative control of
	// that read (an ACK-then-crash sends the committed rows again). Never
	// set it outside tests.
	UnsafeSkipPositions bool
}

// DefaultOwner is the Owner a relay of either mode takes when none is set:
// the host name and the process ID.
func DefaultOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

func (c *Config) setDefaults() {
	if c.Owner == "" {
		c.Owner = DefaultOwner()
	}
	c.SinkName = cmp.Or(c.SinkName, "sink")
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	if c.MinPollInterval == 0 {
		c.MinPollInterval = min(MinPollIntervalDefault, c.PollInterval)
	}
	c.LeaseTTL = cmp.Or(c.LeaseTTL, LeaseTTLDefault)
	c.RetryInitial = cmp.Or(c.RetryInitial, RetryInitialDefault)
	c.RetryMax = cmp.Or(c.RetryMax, RetryMaxDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, StatsIntervalDefault)
	c.ParkAfterAttempts = cmp.Or(c.ParkAfterAttempts, ParkAfterAttemptsDefault)
	c.ParkAfter = cmp.Or(c.ParkAfter, ParkAfterDefault)
	c.StandbyFlush.setDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// ErrInvalidConfig wraps every validation error of Config.
var ErrInvalidConfig = errors.New("invalid relay config")

func (c *Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.BatchSize < 1 || c.BatchSize > 100000:
		return bad("BatchSize", "is %d, want 1 to 100000", c.BatchSize)
	case c.PollInterval < 0 || c.MinPollInterval < 0 || c.MinPollInterval > c.PollInterval:
		return bad("MinPollInterval", "is %s, want 0 < MinPollInterval <= PollInterval (%s)", c.MinPollInterval, c.PollInterval)
	case c.LeaseTTL < 100*time.Millisecond:
		return bad("LeaseTTL", "is %s, want at least 100ms", c.LeaseTTL)
	case c.RetryInitial < 0 || c.RetryMax < c.RetryInitial:
		return bad("RetryMax", "is %s, want at least RetryInitial (%s)", c.RetryMax, c.RetryInitial)
	case c.StatsInterval < 0:
		return bad("StatsInterval", "is %s, want positive", c.StatsInterval)
	}
	return c.StandbyFlush.Validate()
}
