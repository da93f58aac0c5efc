package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSecretsFromFiles(t *testing.T) {
	db := writeSecret(t, "db", "postgres://api:S3cret-db@127.0.0.1:5432/ledger\n")
	sasl := writeSecret(t, "sasl", "S3cret-sasl\r\n")
	tokens := writeSecret(t, "tokens", "# rotated 2026-11\nfirst-token-0123456789\n\nsha256:"+strings.Repeat("ab", 32)+"\n")
	rec := writeSecret(t, "rec", "postgres://rec:S3cret-rec@127.0.0.1/consumers")
	yaml := writeSecret(t, "posthorn.yaml", "reconcile:\n  consumers:\n    - name: audit-log\n      database_url: file:"+rec+"\n")
	cfg, err := Load(yaml, []string{
		"POSTHORN_DATABASE__URL=file:" + db,
		"POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=127.0.0.1:9092",
		"POSTHORN_SINK__KAFKA__SASL__MECHANISM=SCRAM-SHA-512", "POSTHORN_SINK__KAFKA__SASL__USERNAME=relay",
		"POSTHORN_SINK__KAFKA__SASL__PASSWORD=file:" + sasl,
		"POSTHORN_API__TOKENS=file:" + tokens + ",plain-token-0123456789",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database.URL != "postgres://api:S3cret-db@127.0.0.1:5432/ledger" || cfg.Sink.Kafka.SASL.Password != "S3cret-sasl" ||
		cfg.Reconcile.Consumers[0].DatabaseURL != "postgres://rec:S3cret-rec@127.0.0.1/consumers" {
		t.Fatalf("file secrets not read: %+v", cfg)
	}
	if strings.Join(cfg.API.Tokens, ",") != "first-token-0123456789,sha256:"+strings.Repeat("ab", 32)+",plain-token-0123456789" {
		t.Fatalf("tokens: %v", cfg.API.Tokens)
	}
	printed := fmt.Sprintf("%+v", cfg.Redacted())
	for _, s := range []string{"S3cret", "first-token", "plain-token", strings.Repeat("ab", 32)} {
		if strings.Contains(printed, s) {
			t.Errorf("config print shows %q:\n%s", s, printed)
		}
	}
	// Control: the unredacted configuration does hold them (the check above
	// looks at the right thing).
	if !strings.Contains(cfg.Sink.Kafka.SASL.Password+cfg.Database.URL, "S3cret") {
		t.Fatal("control failed")
	}
}

func TestSecretErrorsNameKeyNotContent(t *testing.T) {
	dir := t.TempDir()
	badURL := writeSecret(t, "bad", "mysql://u:S3cret-x@h/db")
	empty := writeSecret(t, "empty", "\n")
	comments := writeSecret(t, "comments", "# nothing\n\n")
	for env, key := range map[string]string{
		"POSTHORN_DATABASE__URL=file:" + filepath.Join(dir, "missing"): "database.url",
		"POSTHORN_DATABASE__URL=file:" + dir:                           "database.url", // a directory
		"POSTHORN_DATABASE__URL=file:" + badURL:                        "database.url",
		"POSTHORN_DATABASE__URL=file:":                                 "database.url",
		"POSTHORN_CONSUMER__DATABASE__URL=file:" + empty:               "consumer.database.url",
		"POSTHORN_API__TOKENS=file:" + comments:                        "api.tokens[0]",
		"POSTHORN_API__TOKENS=sha256:abc":                              "api.tokens[0]",
		"POSTHORN_API__TOKENS=sha256:" + strings.Repeat("zz", 32):      "api.tokens[0]",
		"POSTHORN_SINK__REDIS__PASSWORD=file:" + empty:                 "sink.redis.password",
	} {
		_, err := Load("", []string{env}, nil)
		if err == nil || !strings.Contains(err.Error(), "config key "+key) {
			t.Errorf("%s: %v, want an error naming %s", env, err, key)
			continue
		}
		if strings.Contains(err.Error(), "S3cret") {
			t.Errorf("%s: the error shows the secret: %v", env, err)
		}
	}
}

func TestTokenHashAccepted(t *testing.T) {
	sum := sha256.Sum256([]byte("a-token-of-sufficient-length"))
	cfg, err := Load("", []string{"POSTHORN_API__TOKENS=sha256:" + hex.EncodeToString(sum[:])}, nil)
	if err != nil || len(cfg.API.Tokens) != 1 {
		t.Fatalf("%v %v", cfg.API.Tokens, err)
	}
}

func TestKafkaSecurityKeys(t *testing.T) {
	base := []string{"POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=127.0.0.1:9092"}
	for _, tc := range []struct {
		env []string
		key string
	}{
		{[]string{"POSTHORN_SINK__KAFKA__SASL__MECHANISM=GSSAPI", "POSTHORN_SINK__KAFKA__SASL__USERNAME=u", "POSTHORN_SINK__KAFKA__SASL__PASSWORD=p"}, "sink.kafka.sasl.mechanism"},
		{[]string{"POSTHORN_SINK__KAFKA__SASL__USERNAME=u"}, "sink.kafka.sasl.mechanism"},
		{[]string{"POSTHORN_SINK__KAFKA__SASL__MECHANISM=PLAIN", "POSTHORN_SINK__KAFKA__SASL__PASSWORD=p"}, "sink.kafka.sasl.username"},
		{[]string{"POSTHORN_SINK__KAFKA__SASL__MECHANISM=SCRAM-SHA-256", "POSTHORN_SINK__KAFKA__SASL__USERNAME=u"}, "sink.kafka.sasl.password"},
		{[]string{"POSTHORN_SINK__KAFKA__TLS__CA_FILE=/nonexistent/ca.pem"}, "sink.kafka.tls.ca_file"},
	} {
		_, err := Load("", append(append([]string{}, base...), tc.env...), nil)
		if err == nil || !strings.Contains(err.Error(), "config key "+tc.key) {
			t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.key)
		}
	}
	cfg, err := Load("", append(base, "POSTHORN_SINK__KAFKA__SASL__MECHANISM=SCRAM-SHA-256",
		"POSTHORN_SINK__KAFKA__SASL__USERNAME=u", "POSTHORN_SINK__KAFKA__SASL__PASSWORD=p"), nil)
	if err != nil || cfg.Sink.Kafka.SASL.Mechanism != "SCRAM-SHA-256" {
		t.Fatalf("%+v %v", cfg.Sink.Kafka, err)
	}
}

func TestAPITLSKeys(t *testing.T) {
	if c, err := (APITLS{}).Load(); c != nil || err != nil {
		t.Fatalf("off: %v %v", c, err)
	}
	if _, err := (APITLS{CertFile: "/x.pem"}).Load(); err == nil || !strings.Contains(err.Error(), "api.tls") {
		t.Fatalf("cert without key: %v", err)
	}
	key := writeSecret(t, "key.pem", "-----BEGIN PRIVATE KEY-----\nS3cret\n-----END PRIVATE KEY-----\n")
	cert := writeSecret(t, "cert.pem", "not a certificate")
	_, err := (APITLS{CertFile: cert, KeyFile: key}).Load()
	if err == nil || !strings.Contains(err.Error(), "api.tls.cert_file") || strings.Contains(err.Error(), "S3cret") {
		t.Fatalf("garbage pair: %v", err)
	}
	if _, err := (APITLS{CertFile: "/nonexistent/c.pem", KeyFile: key}).Load(); err == nil || !strings.Contains(err.Error(), "/nonexistent/c.pem") {
		t.Fatalf("missing file: %v", err)
	}
}
