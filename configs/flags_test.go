package configs

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// Every key is a flag named by the key, typed by its default, and a set
// flag beats the environment and the file; an unset one changes nothing.
func TestEveryKeyIsATypedFlag(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	AddKeyFlags(fs, "relay.batch_size")
	for _, key := range Keys() {
		if fs.Lookup(key) == nil {
			t.Errorf("no flag --%s", key)
		}
	}
	types := map[string]string{
		"relay.batch_size":                   "int",
		"relay.poll_interval":                "duration",
		"sink.kafka.brokers":                 "stringSlice",
		"sink.nats.tls.insecure_skip_verify": "bool",
		"tracing.sample_ratio":               "float64",
		"database.url":                       "string",
	}
	for key, typ := range types {
		if got := fs.Lookup(key).Value.Type(); got != typ {
			t.Errorf("--%s is a %s, want %s", key, got, typ)
		}
	}
	if fs.Lookup("relay.batch_size").Hidden || !fs.Lookup("relay.poll_interval").Hidden {
		t.Error("only the shown keys are listed in the help")
	}
	file := writeFile(t, "relay:\n  batch_size: 10\n  poll_interval: 2s\n")
	err := fs.Parse([]string{"--relay.batch_size", "30", "--sink.kafka.brokers=a:1,b:2", "--sink.nats.tls.insecure_skip_verify"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(file, []string{"POSTHORN_RELAY__BATCH_SIZE=20", "POSTHORN_RELAY__LEASE_TTL=7s"}, fs)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Relay.BatchSize != 30 {
		t.Errorf("flag did not beat env and file: relay.batch_size = %d", cfg.Relay.BatchSize)
	}
	if cfg.Relay.PollInterval != 2*time.Second || cfg.Relay.LeaseTTL != 7*time.Second {
		t.Errorf("an unset flag overrode file or env: %s, %s", cfg.Relay.PollInterval, cfg.Relay.LeaseTTL)
	}
	if strings.Join(cfg.Sink.Kafka.Brokers, ",") != "a:1,b:2" || !cfg.Sink.NATS.TLS.InsecureSkipVerify {
		t.Errorf("list or bool flag not applied: %v %v", cfg.Sink.Kafka.Brokers, cfg.Sink.NATS.TLS.InsecureSkipVerify)
	}
	if err := fs.Parse([]string{"--relay.batch_size", "lots"}); err == nil || !strings.Contains(err.Error(), "relay.batch_size") {
		t.Errorf("a non-number for an int key: %v", err)
	}
}

// An environment variable shaped like a key but naming none is refused by
// name with the key it probably meant, as a misspelt key in the file is;
// other programs' POSTHORN_ variables are left alone.
func TestUnknownEnvironmentVariableRefusedByName(t *testing.T) {
	cases := map[string]string{
		"POSTHORN_RELAY__BATCHSIZE=3":          "relay.batch_size",
		"POSTHORN_API__TOKEN=abcdefghijklmnop": "api.tokens",
		"POSTHORN_DATABASE_URL=postgres://x/y": "database.url",
		"POSTHORN_SINK__KAFKA__BROKER=a:1":     "sink.kafka.brokers",
	}
	for env, want := range cases {
		name, _, _ := strings.Cut(env, "=")
		_, err := Load("", []string{env}, nil)
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "did you mean "+want) {
			t.Errorf("%s: %v, want a refusal naming it and suggesting %s", name, err, want)
		}
	}
	// Negative controls: the right spelling is taken, and variables of
	// other programs (tests, role passwords) are not configuration.
	cfg := loadEnv(t, "POSTHORN_RELAY__BATCH_SIZE=3", "POSTHORN_TEST_DATABASE_URL=x", "POSTHORN_ROLE_PASSWORD_API=x",
		"POSTHORN_SINK__AMQP__COMMAND_OWNERS__PAYOUTS=svc")
	if cfg.Relay.BatchSize != 3 || cfg.Sink.AMQP.CommandOwners["payouts"] != "svc" {
		t.Fatalf("valid variables not applied: %d %v", cfg.Relay.BatchSize, cfg.Sink.AMQP.CommandOwners)
	}
	// The file's misspelt key gets the same suggestion.
	if _, err := Load(writeFile(t, "relay:\n  batchsize: 3\n"), []string{}, nil); err == nil || !strings.Contains(err.Error(), "did you mean relay.batch_size") {
		t.Errorf("file typo: %v", err)
	}
}

// Every insecure option that is on is reported; none by default.
func TestInsecureKeys(t *testing.T) {
	if got := loadEnv(t).InsecureKeys(); len(got) != 0 {
		t.Fatalf("defaults report %v", got)
	}
	got := loadEnv(t, "POSTHORN_SINK__NATS__TLS__INSECURE_SKIP_VERIFY=true", "POSTHORN_SINK__KAFKA__TLS__INSECURE_SKIP_VERIFY=true").InsecureKeys()
	if strings.Join(got, ",") != "sink.kafka.tls.insecure_skip_verify,sink.nats.tls.insecure_skip_verify" {
		t.Fatalf("InsecureKeys = %v", got)
	}
}
