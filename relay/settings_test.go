package relay_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/relay"
)

// The defaults validate as they are, and a relay built from zero settings
// takes them, but for the park bounds, whose zero is off.
func TestDefaults(t *testing.T) {
	if err := relay.Defaults().Validate(); err != nil {
		t.Fatalf("Defaults() does not validate: %v", err)
	}
	s, err := relay.Settings{}.Checked()
	if err != nil {
		t.Fatalf("zero settings: %v", err)
	}
	d := relay.Defaults()
	if s.Mode != d.Mode || s.BatchSize != d.BatchSize || s.PollInterval != d.PollInterval || s.LeaseTTL != d.LeaseTTL ||
		s.CDC.Slot != d.CDC.Slot || s.CDC.HeartbeatInterval != d.CDC.HeartbeatInterval || s.StandbyFlush.Policy != relay.StandbyOff ||
		s.Owner == "" || s.Logger == nil {
		t.Fatalf("zero settings defaulted to %+v, want the defaults", s)
	}
	if s.ParkAfterAttempts != 0 || s.ParkAfter != 0 {
		t.Fatalf("zero park bounds became %d, %s; want 0 (off), as in the configuration", s.ParkAfterAttempts, s.ParkAfter)
	}
	if d.ParkAfterAttempts != relay.ParkAfterAttemptsDefault || d.ParkAfter != relay.ParkAfterDefault {
		t.Fatalf("Defaults() park bounds %d, %s", d.ParkAfterAttempts, d.ParkAfter)
	}
}

// Validate checks the values as given and names the configuration key
// (or, for a setting without one, the Go field); each case passes once
// its one bad value is fixed, so the check is what refuses it.
func TestValidateNamesTheKey(t *testing.T) {
	for key, mod := range map[string]func(*relay.Settings){
		"mode":                   func(s *relay.Settings) { s.Mode = "stream" },
		"batch_size":             func(s *relay.Settings) { s.BatchSize = 0 },
		"poll_interval":          func(s *relay.Settings) { s.PollInterval = 0 },
		"lease_ttl":              func(s *relay.Settings) { s.LeaseTTL = 50 * time.Millisecond },
		"park_after_attempts":    func(s *relay.Settings) { s.ParkAfterAttempts = -1 },
		"park_after":             func(s *relay.Settings) { s.ParkAfter = -time.Second },
		"standby_flush":          func(s *relay.Settings) { s.StandbyFlush.Policy = "" },
		"standby_names[1]":       func(s *relay.Settings) { s.StandbyFlush.Names = []string{"a", "a"} },
		"standby_count":          func(s *relay.Settings) { s.StandbyFlush.Count = -1 },
		"cdc.slot":               func(s *relay.Settings) { s.CDC.Slot = "Bad-Slot" },
		"cdc.publication":        func(s *relay.Settings) { s.CDC.Publication = "1pub" },
		"cdc.heartbeat_interval": func(s *relay.Settings) { s.CDC.HeartbeatInterval = 0 },
		"cdc.status_interval":    func(s *relay.Settings) { s.CDC.StatusInterval = -time.Second },
		"MinPollInterval":        func(s *relay.Settings) { s.MinPollInterval = time.Hour },
		"RetryMax":               func(s *relay.Settings) { s.RetryInitial, s.RetryMax = time.Second, time.Millisecond },
		"StatsInterval":          func(s *relay.Settings) { s.StatsInterval = -time.Second },
		"CDC.BatchLinger":        func(s *relay.Settings) { s.CDC.BatchLinger = -time.Second },
	} {
		s := relay.Defaults()
		mod(&s)
		err := s.Validate()
		var fe *relay.FieldError
		if !errors.As(err, &fe) || fe.Key != key || !errors.Is(err, relay.ErrInvalidConfig) || !strings.Contains(err.Error(), key+" ") {
			t.Errorf("%s: Validate = %v, want a FieldError naming %s", key, err, key)
		}
	}
}

// A relay that must wait for the standbys needs a probe to read them:
// Checked refuses it without one, and Validate (the configuration's check,
// which has no probe) does not.
func TestCheckedWantsAStandbyProbe(t *testing.T) {
	s := relay.Defaults()
	s.StandbyFlush.Policy = relay.StandbyRequired
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if _, err := s.Checked(); err == nil || !strings.Contains(err.Error(), "StandbyFlush.Probe") {
		t.Fatalf("Checked without a probe: %v, want an error naming StandbyFlush.Probe", err)
	}
}
