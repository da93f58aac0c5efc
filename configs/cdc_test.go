package configs

import (
	"testing"
	"time"
)

func TestCDCDefaultsAndEnvironment(t *testing.T) {
	cfg := loadEnv(t, "POSTHORN_RELAY__MODE=cdc", "POSTHORN_RELAY__CDC__SLOT=ledger_a", "POSTHORN_RELAY__CDC__HEARTBEAT_INTERVAL=3s")
	c := cfg.Relay.CDC
	if cfg.Relay.Mode != "cdc" || c.Slot != "ledger_a" || c.Publication != "posthorn_outbox" || c.HeartbeatInterval != 3*time.Second || c.StatusInterval != 10*time.Second {
		t.Fatalf("relay: %+v", cfg.Relay)
	}
}

func TestCDCBadValuesNameTheKey(t *testing.T) {
	refusedNamingKey(t, map[string]string{
		"POSTHORN_RELAY__CDC__SLOT=Bad-Slot":         "relay.cdc.slot",
		"POSTHORN_RELAY__CDC__PUBLICATION=1pub":      "relay.cdc.publication",
		"POSTHORN_RELAY__CDC__HEARTBEAT_INTERVAL=0s": "relay.cdc.heartbeat_interval",
		"POSTHORN_RELAY__CDC__STATUS_INTERVAL=-1s":   "relay.cdc.status_interval",
	})
}
