package configs

import "time"

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
	// CDC configures relay.mode cdc (configs/cdc.go).
	CDC CDC `koanf:"cdc"`
}

func defaultRelay() Relay {
	return Relay{
		Mode:         "polling",
		BatchSize:    5000,
		PollInterval: 500 * time.Millisecond,
		LeaseTTL:     10 * time.Second,
		CDC:          defaultCDC(),
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
	if err := r.CDC.validate(); err != nil {
		return err
	}
	return nil
}
