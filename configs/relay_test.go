package configs

import (
	"slices"
	"testing"
	"time"
)

// relay.standby_flush is off by default; required, standby_names and
// standby_count reach the relay's config from the file and the environment.
func TestStandbyFlushKeys(t *testing.T) {
	if sf := loadEnv(t).Relay.StandbyFlush; sf.Required() || sf.Names != nil || sf.Count != 0 {
		t.Fatalf("default standby flush %+v, want off", sf)
	}
	sf := loadEnv(t, "POSTHORN_RELAY__STANDBY_FLUSH=required", "POSTHORN_RELAY__STANDBY_NAMES=eu_1, eu_2",
		"POSTHORN_RELAY__STANDBY_COUNT=1").Relay.StandbyFlush
	if !sf.Required() || !slices.Equal(sf.Names, []string{"eu_1", "eu_2"}) || sf.Count != 1 {
		t.Fatalf("standby flush from env %+v", sf)
	}
	file := writeFile(t, "relay:\n  standby_flush: required\n  standby_names: [eu_1]\n")
	cfg, err := Load(file, []string{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sf := cfg.Relay.StandbyFlush; !sf.Required() || !slices.Equal(sf.Names, []string{"eu_1"}) {
		t.Fatalf("standby flush from file %+v", sf)
	}
}

// relay.* is checked by the relay's own settings (relay.Settings.Validate);
// the error a user sees at load still names the key in full.
func TestRelayBadValuesNameTheKey(t *testing.T) {
	refusedNamingKey(t, map[string]string{
		"POSTHORN_RELAY__MODE=stream":                "relay.mode",
		"POSTHORN_RELAY__BATCH_SIZE=0":               "relay.batch_size",
		"POSTHORN_RELAY__POLL_INTERVAL=0s":           "relay.poll_interval",
		"POSTHORN_RELAY__LEASE_TTL=50ms":             "relay.lease_ttl",
		"POSTHORN_RELAY__CDC__SLOT=Bad-Slot":         "relay.cdc.slot",
		"POSTHORN_RELAY__CDC__PUBLICATION=1pub":      "relay.cdc.publication",
		"POSTHORN_RELAY__CDC__HEARTBEAT_INTERVAL=0s": "relay.cdc.heartbeat_interval",
		"POSTHORN_RELAY__CDC__STATUS_INTERVAL=-1s":   "relay.cdc.status_interval",
		"POSTHORN_RELAY__STANDBY_FLUSH=yes":          "relay.standby_flush",
		"POSTHORN_RELAY__STANDBY_COUNT=-1":           "relay.standby_count",
		"POSTHORN_RELAY__STANDBY_NAMES=a,a":          "relay.standby_names[1]",
		"POSTHORN_RELAY__STANDBY_NAMES=a\x01b":       "relay.standby_names[0]",
		"POSTHORN_RELAY__STANDBY_NAMES=x1234567890123456789012345678901234567890123456789012345678901234": "relay.standby_names[0]",
	})
	if _, err := Load("", []string{"POSTHORN_RELAY__STANDBY_NAMES=a,b", "POSTHORN_RELAY__STANDBY_COUNT=3"}, nil); err == nil {
		t.Fatal("standby_count 3 of 2 names accepted")
	}
}

func TestCDCDefaultsAndEnvironment(t *testing.T) {
	cfg := loadEnv(t, "POSTHORN_RELAY__MODE=cdc", "POSTHORN_RELAY__CDC__SLOT=ledger_a", "POSTHORN_RELAY__CDC__HEARTBEAT_INTERVAL=3s")
	c := cfg.Relay.CDC
	if cfg.Relay.Mode != "cdc" || c.Slot != "ledger_a" || c.Publication != "posthorn_outbox" || c.HeartbeatInterval != 3*time.Second || c.StatusInterval != 10*time.Second {
		t.Fatalf("relay: %+v", cfg.Relay)
	}
}
