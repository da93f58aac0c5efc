package configs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/posthorn/posthorn/core"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "posthorn.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// loadEnv is Load with no file, only env as the environment (not the
// process's) and no flags, failing t when it refuses.
func loadEnv(t *testing.T, env ...string) Config {
	t.Helper()
	cfg, err := Load("", append([]string{}, env...), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// refusedNamingKey checks that each environment entry alone (the map's key)
// makes Load refuse with an error that names its config key (the value).
func refusedNamingKey(t *testing.T, cases map[string]string) {
	t.Helper()
	for env, key := range cases {
		if _, err := Load("", []string{env}, nil); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", env, err, key)
		}
	}
}

func TestDefaultsAreValid(t *testing.T) {
	cfg := loadEnv(t)
	if cfg.API.Listen != "127.0.0.1:8080" || cfg.Relay.Mode != "polling" || cfg.Sink.Kind != "kafka" {
		t.Fatalf("unexpected defaults: %+v", cfg)
	}
}

func TestExampleFileLoads(t *testing.T) {
	cfg, err := Load("posthorn.example.yaml", []string{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Metrics.Listen != Default().Metrics.Listen || cfg.Relay.LeaseTTL != 10*time.Second {
		t.Fatalf("example not applied: %+v", cfg)
	}
}

// Each layer overrides the one below: defaults < file < environment < flags.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "api:\n  listen: 127.0.0.1:1001\nrelay:\n  batch_size: 10\n  mode: cdc\nsink:\n  kafka:\n    brokers: [f:1]\n")
	env := []string{
		"POSTHORN_API__LISTEN=127.0.0.1:1002",
		"POSTHORN_RELAY__BATCH_SIZE=20",
		"POSTHORN_SINK__KAFKA__BROKERS=e:1, e:2",
		"POSTHORN_TEST_DATABASE_URL=not-a-config-key",
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("api.listen", "", "")
	fs.String("relay.mode", "", "")
	if err := fs.Parse([]string{"--api.listen=127.0.0.1:1003"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(file, env, fs)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.API.Listen != "127.0.0.1:1003" {
		t.Errorf("flag did not win: api.listen = %s", cfg.API.Listen)
	}
	if cfg.Relay.BatchSize != 20 {
		t.Errorf("env did not beat file: relay.batch_size = %d", cfg.Relay.BatchSize)
	}
	if cfg.Relay.Mode != "cdc" {
		t.Errorf("unset flag overrode file: relay.mode = %s", cfg.Relay.Mode)
	}
	if strings.Join(cfg.Sink.Kafka.Brokers, ",") != "e:1,e:2" {
		t.Errorf("comma-separated env list: %v", cfg.Sink.Kafka.Brokers)
	}
}

func TestBadValuesNameTheKey(t *testing.T) {
	cases := []struct {
		name, file string
		env        []string
		key        string
	}{
		{"unknown key in file", "relay:\n  batchsize: 3\n", nil, "relay.batchsize"},
		{"not a number", "", []string{"POSTHORN_RELAY__BATCH_SIZE=lots"}, "relay.batch_size"},
		{"batch size out of range", "", []string{"POSTHORN_RELAY__BATCH_SIZE=0"}, "relay.batch_size"},
		{"bad mode", "", []string{"POSTHORN_RELAY__MODE=push"}, "relay.mode"},
		{"bad duration", "", []string{"POSTHORN_RELAY__LEASE_TTL=soon"}, "relay.lease_ttl"},
		{"negative duration", "", []string{"POSTHORN_RELAY__POLL_INTERVAL=-1s"}, "relay.poll_interval"},
		{"bad sink kind", "", []string{"POSTHORN_SINK__KIND=carrier-pigeon"}, "sink.kind"},
		{"kafka without brokers", "sink:\n  kafka:\n    brokers: []\n", nil, "sink.kafka.brokers"},
		{"bad broker address", "", []string{"POSTHORN_SINK__KAFKA__BROKERS=nohostport"}, "sink.kafka.brokers[0]"},
		{"unknown kafka partitioner", "", []string{"POSTHORN_SINK__KAFKA__PARTITIONER=crc32"}, "sink.kafka.partitioner"},
		{"unknown wire format", "", []string{"POSTHORN_SINK__FORMAT=avro"}, "sink.format"},
		{"cloudevents source with a space", "", []string{"POSTHORN_SINK__FORMAT=cloudevents", "POSTHORN_SINK__CLOUDEVENTS__SOURCE=/ledger eu"}, "sink.cloudevents.source"},
		{"cloudevents source empty", "sink:\n  format: cloudevents\n  cloudevents:\n    source: \"\"\n", nil, "sink.cloudevents.source"},
		{"exactly-once with a bad transactional id prefix", "", []string{"POSTHORN_SINK__KAFKA__EXACTLY_ONCE=true", "POSTHORN_SINK__KAFKA__TRANSACTIONAL_ID_PREFIX=a b"}, "sink.kafka.transactional_id_prefix"},
		{"exactly-once not a bool", "", []string{"POSTHORN_SINK__KAFKA__EXACTLY_ONCE=maybe"}, "sink.kafka.exactly_once"},
		{"bad database url", "", []string{"POSTHORN_DATABASE__URL=mysql://x/y"}, "database.url"},
		{"garbage dsn", "", []string{"POSTHORN_CONSUMER__DATABASE__URL=hello"}, "consumer.database.url"},
		{"consumer instance id with a space", "", []string{"POSTHORN_CONSUMER__INSTANCE_ID=node 1"}, "consumer.instance_id"},
		{"consumer instance id too long", "", []string{"POSTHORN_CONSUMER__INSTANCE_ID=" + strings.Repeat("n", 101)}, "consumer.instance_id"},
		{"bad listen", "", []string{"POSTHORN_API__LISTEN=8080"}, "api.listen"},
		{"short token", "", []string{"POSTHORN_API__TOKENS=short"}, "api.tokens[0]"},
		{"bad log level", "log:\n  level: loud\n", nil, "log.level"},
		{"bad log format", "", []string{"POSTHORN_LOG__FORMAT=xml"}, "log.format"},
		{"reconcile consumer without url", "reconcile:\n  consumers:\n    - name: a\n", nil, "reconcile.consumers[0].database_url"},
		{"reconcile topic with a space", "reconcile:\n  consumers:\n    - name: a\n      database_url: postgres://h/c\n      topics: [ledger.events, \"events wallet\"]\n", nil, "reconcile.consumers[0].topics[1]"},
		{"reconcile balance view not a name", "reconcile:\n  consumers:\n    - name: a\n      database_url: postgres://h/c\n      balance_view: \"b; drop table x\"\n", nil, "reconcile.consumers[0].balance_view"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			env := tc.env
			if env == nil {
				env = []string{}
			}
			_, err := Load(path, env, nil)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %q does not name %s", err, tc.key)
			}
		})
	}
}

func TestMissingFileIsAnError(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), []string{}, nil); err == nil {
		t.Fatal("missing config file accepted")
	}
}

func TestRequireNamesTheKey(t *testing.T) {
	var fe *FieldError
	if err := (Config{}).RequireDatabase(); !errors.As(err, &fe) || fe.Key != "database.url" {
		t.Fatalf("RequireDatabase = %v", err)
	}
	if err := (Config{}).RequireConsumerDatabase(); !errors.As(err, &fe) || fe.Key != "consumer.database.url" {
		t.Fatalf("RequireConsumerDatabase = %v", err)
	}
}

func TestSecretsNeverInErrorsOrRedactedConfig(t *testing.T) {
	const secret = "s3cr3t-pa55word"
	cfg := loadEnv(t,
		"POSTHORN_DATABASE__URL=postgres://app:"+secret+"@db:5432/ledger?sslmode=disable",
		"POSTHORN_CONSUMER__DATABASE__URL=host=db user=app password="+secret+" dbname=c",
		"POSTHORN_API__TOKENS="+secret+"-and-more-token",
	)
	r := cfg.Redacted()
	for _, s := range []string{r.Database.URL, r.Consumer.Database.URL, strings.Join(r.API.Tokens, ",")} {
		if strings.Contains(s, secret) {
			t.Fatalf("secret survives redaction: %s", s)
		}
	}
	if !strings.Contains(r.Database.URL, "app:REDACTED@db:5432") {
		t.Fatalf("redaction mangled the URL: %s", r.Database.URL)
	}
	// A validation error about a secret-bearing key must not echo it.
	_, err := Load("", []string{"POSTHORN_DATABASE__URL=mysql://app:" + secret + "@db/x"}, nil)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("error leaks or is missing: %v", err)
	}
}

// The example file documents every key: a key added to the configuration
// without its line in posthorn.example.yaml fails here.
func TestExampleFileListsEveryKey(t *testing.T) {
	defaults := koanf.New(".")
	if err := defaults.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		t.Fatal(err)
	}
	example := koanf.New(".")
	if err := example.Load(file.Provider("posthorn.example.yaml"), yaml.Parser()); err != nil {
		t.Fatal(err)
	}
	for _, key := range defaults.Keys() {
		if !example.Exists(key) {
			t.Errorf("posthorn.example.yaml lacks %s", key)
		}
	}
}

// sink.format and sink.cloudevents.source reach the wire format; the
// default is Posthorn's own headers under the default source.
func TestWireFormatFromConfig(t *testing.T) {
	if f := loadEnv(t).Sink.WireFormat(); f.Format != core.FormatPosthorn || f.Source != core.DefaultCloudEventsSource {
		t.Fatalf("default wire format %+v", f)
	}
	f := loadEnv(t, "POSTHORN_SINK__FORMAT=cloudevents", "POSTHORN_SINK__CLOUDEVENTS__SOURCE=urn:bank:ledger:eu-1").Sink.WireFormat()
	if f.Format != core.FormatCloudEvents || f.Source != "urn:bank:ledger:eu-1" {
		t.Fatalf("configured wire format %+v", f)
	}
}

// consumer.instance_id is off (dynamic membership) by default and read from
// the file and the environment.
func TestConsumerInstanceID(t *testing.T) {
	if cfg := loadEnv(t); cfg.Consumer.InstanceID != "" {
		t.Fatalf("default instance id %q, want none", cfg.Consumer.InstanceID)
	}
	if cfg := loadEnv(t, "POSTHORN_CONSUMER__INSTANCE_ID=node-1.eu_west"); cfg.Consumer.InstanceID != "node-1.eu_west" {
		t.Fatalf("instance id from env %q", cfg.Consumer.InstanceID)
	}
	cfg, err := Load(writeFile(t, "consumer:\n  instance_id: node-2\n"), []string{}, nil)
	if err != nil || cfg.Consumer.InstanceID != "node-2" {
		t.Fatalf("instance id from file %q, %v", cfg.Consumer.InstanceID, err)
	}
}
