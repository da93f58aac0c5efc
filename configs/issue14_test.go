package configs

import (
	"strings"
	"testing"
	"time"
)

// The keys issue 14 adds: defaults, the environment form, the mapping of
// "0 = off" to the relay's "negative = off", and errors naming the key.
func TestIssue14KeysDefaultsAndValidation(t *testing.T) {
	cfg, err := Load("", []string{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Relay.ParkAfterAttempts != 30 || cfg.Relay.ParkAfter != 5*time.Minute {
		t.Fatalf("relay retry-park defaults: %d %s", cfg.Relay.ParkAfterAttempts, cfg.Relay.ParkAfter)
	}
	cfg, err = Load("", []string{"POSTHORN_RELAY__PARK_AFTER_ATTEMPTS=0", "POSTHORN_RELAY__PARK_AFTER=90s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, d := cfg.Relay.RetryPark(); a != -1 || d != 90*time.Second {
		t.Fatalf("RetryPark() = %d, %s; want -1 (off), 90s", a, d)
	}
	for env, key := range map[string]string{
		"POSTHORN_RELAY__PARK_AFTER_ATTEMPTS=-3": "relay.park_after_attempts",
		"POSTHORN_RELAY__PARK_AFTER=-1s":         "relay.park_after",
	} {
		if _, err := Load("", []string{env}, nil); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", env, err, key)
		}
	}
}
