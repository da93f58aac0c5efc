package configs

import (
	"os"
	"strings"
	"testing"
	"time"
)

// The retry-park, retention, cleanup and rejected-final keys: defaults, the
// environment form, "0 = off" reaching the relay as it is (the relay's own
// meaning of 0), and errors naming the key.
func TestRetentionCleanupAndRejectedFinalKeys(t *testing.T) {
	cfg := loadEnv(t)
	if cfg.Relay.ParkAfterAttempts != 30 || cfg.Relay.ParkAfter != 5*time.Minute {
		t.Fatalf("relay retry-park defaults: %d %s", cfg.Relay.ParkAfterAttempts, cfg.Relay.ParkAfter)
	}
	cfg = loadEnv(t, "POSTHORN_RELAY__PARK_AFTER_ATTEMPTS=0", "POSTHORN_RELAY__PARK_AFTER=90s")
	if a, d := cfg.Relay.ParkAfterAttempts, cfg.Relay.ParkAfter; a != 0 || d != 90*time.Second {
		t.Fatalf("relay park bounds %d, %s; want 0 (off), 90s", a, d)
	}
	if cfg.Consumer.Hold != 30*time.Second || cfg.Retention.Interval != time.Hour || cfg.Retention.BatchSize != 1000 ||
		cfg.Retention.InboxMargin != 24*time.Hour || cfg.Retention.IdempotencyKeyTTL != 720*time.Hour {
		t.Fatalf("consumer.hold %s, retention %+v", cfg.Consumer.Hold, cfg.Retention)
	}
	cfg, err := Load("", []string{"POSTHORN_CONSUMER__HOLD=2m", "POSTHORN_RETENTION__IDEMPOTENCY_KEY_TTL=48h", "POSTHORN_RETENTION__INTERVAL=0s"}, nil)
	if err != nil || cfg.Consumer.Hold != 2*time.Minute || cfg.Retention.IdempotencyKeyTTL != 48*time.Hour || cfg.Retention.Interval != 0 {
		t.Fatalf("from env: %+v %+v %v", cfg.Consumer, cfg.Retention, err)
	}
	refusedNamingKey(t, map[string]string{
		"POSTHORN_RELAY__PARK_AFTER_ATTEMPTS=-3":      "relay.park_after_attempts",
		"POSTHORN_RELAY__PARK_AFTER=-1s":              "relay.park_after",
		"POSTHORN_CONSUMER__HOLD=0s":                  "consumer.hold",
		"POSTHORN_RETENTION__INTERVAL=-1m":            "retention.interval",
		"POSTHORN_RETENTION__BATCH_SIZE=0":            "retention.batch_size",
		"POSTHORN_RETENTION__INBOX_MARGIN=1s":         "retention.inbox_margin",
		"POSTHORN_RETENTION__IDEMPOTENCY_KEY_TTL=10m": "retention.idempotency_key_ttl",
	})
}

// sink.amqp.command_owners is a map of service to consumer: its entries
// are accepted in the file, and a nested key still is not.
func TestCommandOwnersMap(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/good.yaml"
	if err := os.WriteFile(good, []byte("sink:\n  amqp:\n    command_owners:\n      payouts: payouts-worker\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(good, []string{}, nil)
	if err != nil || cfg.Sink.AMQP.CommandOwners["payouts"] != "payouts-worker" {
		t.Fatalf("command_owners: %+v %v", cfg.Sink.AMQP.CommandOwners, err)
	}
	bad := dir + "/bad.yaml"
	if err := os.WriteFile(bad, []byte("sink:\n  amqp:\n    command_owners:\n      payouts:\n        x: y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad, []string{}, nil); err == nil || !strings.Contains(err.Error(), "sink.amqp.command_owners.payouts.x") {
		t.Fatalf("nested key: %v, want an error naming it", err)
	}
}
