package configs

import (
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Secrets from files.
//
// Every secret key (SecretKeys) may be given its value directly (YAML,
// environment, flag) or as "file:/path": the value is then the file's
// content with trailing newlines removed, read once at Load. That is how
// container secrets (/run/secrets/…, Kubernetes secret volumes) reach
// Posthorn without putting a password into an environment variable or a
// config file. For api.tokens, a file holds one token per line (blank lines
// and lines starting with # are skipped), and a token may be given as
// "sha256:<64 hex digits>", the SHA-256 of the token, so the configuration
// does not hold the token itself.
//
// Errors name the key and the path, never the content.

// FilePrefix marks a secret value that is read from a file.
const FilePrefix = "file:"

// TokenHashPrefix marks an api.tokens entry given as the token's SHA-256.
const TokenHashPrefix = "sha256:"

// SecretKeys lists the keys whose values are secrets: they accept
// "file:/path" and are redacted by Redacted. (Lists and per-item keys are
// named by their list key.)
var SecretKeys = []string{
	"database.url", "consumer.database.url", "api.tokens",
	"sink.kafka.sasl.password",
	"sink.nats.url", "sink.nats.password", "sink.nats.token",
	"sink.amqp.url", "sink.amqp.password",
	"sink.redis.password", "sink.postgres.url",
	"reconcile.consumers[].database_url", "console.token", "console.operators",
}

// resolveSecrets replaces every "file:" secret by its file's content.
func (c *Config) resolveSecrets() error {
	for _, s := range []struct {
		key string
		v   *string
	}{
		{"database.url", &c.Database.URL},
		{"consumer.database.url", &c.Consumer.Database.URL},
		{"sink.kafka.sasl.password", &c.Sink.Kafka.SASL.Password},
		{"sink.nats.url", &c.Sink.NATS.URL},
		{"sink.nats.password", &c.Sink.NATS.Password},
		{"sink.nats.token", &c.Sink.NATS.Token},
		{"sink.amqp.url", &c.Sink.AMQP.URL},
		{"sink.amqp.password", &c.Sink.AMQP.Password},
		{"sink.redis.password", &c.Sink.Redis.Password},
		{"sink.postgres.url", &c.Sink.Postgres.URL},
		{"console.token", &c.Console.Token},
	} {
		v, err := readSecret(s.key, *s.v)
		if err != nil {
			return err
		}
		*s.v = v
	}
	for name, t := range c.Console.Operators {
		v, err := readSecret("console.operators."+name, t)
		if err != nil {
			return err
		}
		c.Console.Operators[name] = v
	}
	for i := range c.Reconcile.Consumers {
		key := fmt.Sprintf("reconcile.consumers[%d].database_url", i)
		v, err := readSecret(key, c.Reconcile.Consumers[i].DatabaseURL)
		if err != nil {
			return err
		}
		c.Reconcile.Consumers[i].DatabaseURL = v
	}
	var tokens []string
	for i, t := range c.API.Tokens {
		if !strings.HasPrefix(t, FilePrefix) {
			tokens = append(tokens, t)
			continue
		}
		key := fmt.Sprintf("api.tokens[%d]", i)
		content, err := readSecret(key, t)
		if err != nil {
			return err
		}
		n := 0
		for _, line := range strings.Split(content, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			tokens = append(tokens, line)
			n++
		}
		if n == 0 {
			return fieldErr(key, "file %s holds no token", strings.TrimPrefix(t, FilePrefix))
		}
	}
	c.API.Tokens = tokens
	return nil
}

// readSecret returns v, or the content of the file v names.
func readSecret(key, v string) (string, error) {
	path, ok := strings.CutPrefix(v, FilePrefix)
	if !ok {
		return v, nil
	}
	if path == "" {
		return "", fieldErr(key, "names no file after %q", FilePrefix)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		// The *PathError's own text repeats the path; keep only the cause.
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", fieldErr(key, "file %s cannot be read: %v", path, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fieldErr(key, "file %s is empty", path)
	}
	return s, nil
}

// validateTokenHashes checks the api.tokens entries given as hashes.
func (a API) validateTokenHashes() error {
	for i, t := range a.Tokens {
		h, ok := strings.CutPrefix(t, TokenHashPrefix)
		if !ok {
			continue
		}
		if b, err := hex.DecodeString(h); err != nil || len(b) != 32 {
			return fieldErr(fmt.Sprintf("api.tokens[%d]", i), "starts with %q but is not followed by 64 hex digits (the token's SHA-256)", TokenHashPrefix)
		}
	}
	return nil
}

// APITLS is the Posting API's TLS: a certificate (chain) and its key, PEM.
// Both empty means plain HTTP.
type APITLS struct {
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
}

// Enabled reports whether TLS is configured.
func (t APITLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// Load returns the server's tls.Config (nil when TLS is off). Errors name
// the key; they never quote the key file's content.
func (t APITLS) Load() (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, fieldErr("api.tls.cert_file", "and api.tls.key_file must be set together")
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, fieldErr("api.tls.cert_file", "or api.tls.key_file cannot be read: %s: %v", pe.Path, pe.Err)
		}
		return nil, fieldErr("api.tls.cert_file", "and api.tls.key_file are not a matching PEM certificate and key")
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}
