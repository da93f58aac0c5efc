package configs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/posthorn/posthorn/relay/polling"
)

// Relay configures the bridge from the outbox to the sink.
type Relay struct {
	// Mode is polling (default) or cdc.
	Mode string `koanf:"mode"`
	// BatchSize is the most rows read and published at once.
	BatchSize int `koanf:"batch_size"`
	// PollInterval is the longest an idle relay waits before looking again
	// when no notification arrives.
	PollInterval time.Duration `koanf:"poll_interval"`
	// LeaseTTL is how long a shard lease lasts without renewal; a relay
	// stalled for longer loses its shards to another.
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// Owner names this relay in leases; default host name and process ID.
	Owner string `koanf:"owner"`
	// ParkAfterAttempts and ParkAfter bound how long one record may keep
	// failing retryably (while the sink takes other records) before its
	// aggregate is parked with the last error as reason: after that many
	// attempts or that long, whichever comes first. 0 turns a bound off;
	// both 0 is the old behaviour (one such record backs off every batch
	// for ever). A broker-wide outage never parks: it only backs off.
	ParkAfterAttempts int           `koanf:"park_after_attempts"`
	ParkAfter         time.Duration `koanf:"park_after"`
	// StandbyFlush is off (default) or required: publish a row only once
	// the ledger's standbys have flushed its commit, so a failover never
	// promotes a standby lacking an event already published.
	StandbyFlush string `koanf:"standby_flush"`
	// StandbyNames are the application_names of the standbys that count;
	// empty: any physical standby.
	StandbyNames []string `koanf:"standby_names"`
	// StandbyCount is how many of them must have flushed; 0: all of
	// StandbyNames, or one when it is empty.
	StandbyCount int `koanf:"standby_count"`
	// CDC configures relay.mode cdc (configs/cdc.go).
	CDC CDC `koanf:"cdc"`
}

func defaultRelay() Relay {
	return Relay{
		Mode:              "polling",
		BatchSize:         polling.BatchSizeDefault,
		PollInterval:      polling.PollIntervalDefault,
		LeaseTTL:          polling.LeaseTTLDefault,
		ParkAfterAttempts: polling.ParkAfterAttemptsDefault,
		ParkAfter:         polling.ParkAfterDefault,
		StandbyFlush:      "off",
		CDC:               defaultCDC(),
	}
}

func (r Relay) validate() error {
	if r.Mode != "polling" && r.Mode != "cdc" {
		return fieldErr("relay.mode", "is %q, want polling or cdc", r.Mode)
	}
	if r.BatchSize < 1 || r.BatchSize > 100000 {
		return fieldErr("relay.batch_size", "is %d, want 1 to 100000", r.BatchSize)
	}
	if err := positive("relay.poll_interval", r.PollInterval); err != nil {
		return err
	}
	if err := positive("relay.lease_ttl", r.LeaseTTL); err != nil {
		return err
	}
	if r.ParkAfterAttempts < 0 || r.ParkAfterAttempts > 1_000_000 {
		return fieldErr("relay.park_after_attempts", "is %d, want 0 (off) to 1000000", r.ParkAfterAttempts)
	}
	if r.ParkAfter < 0 {
		return fieldErr("relay.park_after", "must not be negative (0 turns it off), is %s", r.ParkAfter)
	}
	if err := r.validateStandby(); err != nil {
		return err
	}
	if err := r.CDC.validate(); err != nil {
		return err
	}
	return nil
}

func (r Relay) validateStandby() error {
	if r.StandbyFlush != "off" && r.StandbyFlush != "required" {
		return fieldErr("relay.standby_flush", "is %q, want off or required", r.StandbyFlush)
	}
	for i, n := range r.StandbyNames {
		// An application_name is at most 63 bytes of printable ASCII (the
		// server replaces anything else with '?').
		if n == "" || len(n) > 63 || strings.IndexFunc(n, func(c rune) bool { return c < 0x20 || c > 0x7e }) >= 0 {
			return fieldErr(fmt.Sprintf("relay.standby_names[%d]", i), "is %q, want 1 to 63 printable ASCII characters (a standby's application_name)", n)
		}
		if slices.Index(r.StandbyNames, n) != i {
			return fieldErr(fmt.Sprintf("relay.standby_names[%d]", i), "names %q twice", n)
		}
	}
	if r.StandbyCount < 0 || len(r.StandbyNames) > 0 && r.StandbyCount > len(r.StandbyNames) {
		return fieldErr("relay.standby_count", "is %d, want 0 (all of relay.standby_names, or one standby when it is empty) to the number of relay.standby_names (%d)", r.StandbyCount, len(r.StandbyNames))
	}
	return nil
}

// StandbyFlushConfig returns relay.standby_flush, standby_names and
// standby_count as both relay modes take them, reading the standbys
// through probe (which also serves the warning at start when it is off).
func (r Relay) StandbyFlushConfig(probe polling.StandbyProbe) polling.StandbyFlush {
	return polling.StandbyFlush{Required: r.StandbyFlush == "required", Names: r.StandbyNames, Count: r.StandbyCount, Probe: probe}
}

// offIfZero maps a configuration bound where 0 means "off" to the relay's,
// where 0 means "the default" and negative means off.
func offIfZero[T ~int | ~int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// RetryPark returns ParkAfterAttempts and ParkAfter as polling.Config and
// cdc.Config take them (0 there means the default, negative off).
func (r Relay) RetryPark() (attempts int, after time.Duration) {
	return offIfZero(r.ParkAfterAttempts), offIfZero(r.ParkAfter)
}
