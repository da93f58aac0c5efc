package configs

import (
	"time"

	"github.com/posthorn/posthorn/bridge"
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
	// CDC configures relay.mode cdc (configs/cdc.go).
	CDC CDC `koanf:"cdc"`
}

func defaultRelay() Relay {
	return Relay{
		Mode:              "polling",
		BatchSize:         bridge.BatchSizeDefault,
		PollInterval:      bridge.PollIntervalDefault,
		LeaseTTL:          bridge.LeaseTTLDefault,
		ParkAfterAttempts: bridge.ParkAfterAttemptsDefault,
		ParkAfter:         bridge.ParkAfterDefault,
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
	if err := r.CDC.validate(); err != nil {
		return err
	}
	return nil
}

// offIfZero maps a configuration bound where 0 means "off" to the relay's,
// where 0 means "the default" and negative means off.
func offIfZero[T ~int | ~int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// RetryPark returns ParkAfterAttempts and ParkAfter as bridge.Config and
// cdc.Config take them (0 there means the default, negative off).
func (r Relay) RetryPark() (attempts int, after time.Duration) {
	return offIfZero(r.ParkAfterAttempts), offIfZero(r.ParkAfter)
}
