// Package configs loads and validates Posthorn's configuration with koanf:
// embedded defaults < YAML file (--config) < environment (POSTHORN_ +
// upper-case path, __ between levels) < command-line flags named by key.
//
// koanf stays here and in cmd/: every other package takes the plain structs
// below, so tests build them directly. Validation errors name the key.
// Secrets (passwords in URLs, tokens) never leave this package unredacted
// through String, Redacted or an error.
package configs

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/relay"
)

// EnvPrefix prefixes every environment variable that sets a key.
const EnvPrefix = "POSTHORN_"

// Config is the whole configuration. Each section validates itself.
type Config struct {
	Database  Database       `koanf:"database"`
	Consumer  Consumer       `koanf:"consumer"`
	API       API            `koanf:"api"`
	Metrics   Metrics        `koanf:"metrics"`
	Sink      Sink           `koanf:"sink"`
	Relay     relay.Settings `koanf:"relay"`
	Reconcile Reconcile      `koanf:"reconcile"`
	Log       Log            `koanf:"log"`
	Archive   Archive        `koanf:"archive"`
	Cleanup   Cleanup        `koanf:"cleanup"`
	Outbox    Outbox         `koanf:"outbox"`
	Retention Retention      `koanf:"retention"`
	Console   Console        `koanf:"console"`
	Tracing   Tracing        `koanf:"tracing"`
}

// Database is a Postgres connection.
type Database struct {
	// URL is a postgres:// DSN; it may carry a password, so it is redacted
	// wherever it is printed.
	URL string `koanf:"url"`
}

// Consumer configures the example consumers.
type Consumer struct {
	Database Database `koanf:"database"`
	// Hold is how long an event that arrived ahead of its predecessor is
	// held before its account is parked (consumers.DefaultHoldTime; the
	// `posthorn consume --hold` flag overrides it).
	Hold time.Duration `koanf:"hold"`
	// InstanceID, when set, makes this process a static member of its
	// Kafka consumer groups (KIP-345): restarted with the same ID within
	// the session timeout, it takes its partitions back without a
	// rebalance. Every process needs its own; empty is dynamic membership.
	InstanceID string `koanf:"instance_id"`
}

// instanceIDRE is what Kafka accepts as a group.instance.id, shortened so
// that ".<topic>" still fits in its 249 characters (kafkagroup.Options).
var instanceIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

func (c Consumer) validate() error {
	if c.Hold <= 0 {
		return fieldErr("consumer.hold", "must be positive, is %s", c.Hold)
	}
	if c.InstanceID != "" && !instanceIDRE.MatchString(c.InstanceID) {
		return fieldErr("consumer.instance_id", "must be 1 to 100 letters, digits, '.', '_' or '-', is %q", c.InstanceID)
	}
	return nil
}

// API configures the Posting API.
type API struct {
	Listen string `koanf:"listen"`
	// Tokens are the accepted bearer tokens; empty means authentication is
	// off, which the API logs loudly at start. An entry may be the token's
	// SHA-256 ("sha256:<hex>") or "file:/path" (secrets.go).
	Tokens []string `koanf:"tokens"`
	// TLS serves the API over HTTPS (secrets.go).
	TLS APITLS `koanf:"tls"`
}

// Metrics configures the /metrics, /healthz and /readyz listener of the
// relay and the consumers. Empty means off.
type Metrics struct {
	Listen string `koanf:"listen"`
}

// Log configures structured logging to stderr.
type Log struct {
	Level string `koanf:"level"`
	// Format is auto (text lines when stderr is a terminal, JSON
	// otherwise), text or json.
	Format string `koanf:"format"`
}

// Default returns the embedded defaults.
func Default() Config {
	return Config{
		API:       API{Listen: "127.0.0.1:8080"},
		Sink:      defaultSink(),
		Relay:     relay.Defaults(),
		Reconcile: Reconcile{},
		Log:       Log{Level: "info", Format: "auto"},
		Archive:   defaultArchive(),
		Cleanup:   defaultCleanup(),
		Outbox:    defaultOutbox(),
		Consumer:  Consumer{Hold: consumers.DefaultHoldTime},
		Retention: defaultRetention(),
		Console:   defaultConsole(),
		Tracing:   defaultTracing(),
	}
}

// FieldError is a validation error naming the configuration key.
type FieldError struct {
	Key string
	Msg string
}

func (e *FieldError) Error() string { return fmt.Sprintf("config key %s: %s", e.Key, e.Msg) }

func fieldErr(key, format string, args ...any) error {
	return &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// mapKeys are the keys whose value is a map with names of the user's as
// keys (its entries are not in the defaults).
var mapKeys = []string{"sink.amqp.command_owners", "console.operators"}

func isMapEntry(key string) bool {
	for _, m := range mapKeys {
		if rest, ok := strings.CutPrefix(key, m+"."); ok && rest != "" && !strings.Contains(rest, ".") {
			return true
		}
	}
	return false
}

// Load merges defaults, the YAML file at path (if not empty), the
// environment (environ; nil means os.Environ) and the flags that were set
// on fs (nil for none), then validates the result.
func Load(path string, environ []string, fs *pflag.FlagSet) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(structs.Provider(Default(), "koanf"), nil); err != nil {
		return Config{}, fmt.Errorf("config defaults: %w", err)
	}
	known := make(map[string]bool)
	for _, key := range k.Keys() {
		known[key] = true
	}
	if path != "" {
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
		// A misspelt key would otherwise be ignored silently.
		for _, key := range k.Keys() {
			if !known[key] && !isMapEntry(key) {
				return Config{}, unknownKeyErr(key, "in "+path)
			}
		}
	}
	if environ == nil {
		environ = os.Environ()
	}
	var unknownEnv []string
	sections := sections()
	envProvider := env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			key := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, EnvPrefix)), "__", ".")
			if known[key] || isMapEntry(key) {
				return key, value
			}
			// A variable shaped like a key (levels joined by "__", or a
			// section's name first) but naming none is a typo, refused
			// as a misspelt YAML key is; anything else is another
			// program's (a test's POSTHORN_TEST_…).
			section, _, _ := strings.Cut(strings.ReplaceAll(key, "_", "."), ".")
			if strings.Contains(name, "__") || sections[section] {
				unknownEnv = append(unknownEnv, name)
			}
			return "", nil
		},
	})
	if err := k.Load(envProvider, nil); err != nil {
		return Config{}, fmt.Errorf("config environment: %w", err)
	}
	if len(unknownEnv) > 0 {
		sort.Strings(unknownEnv)
		name := unknownEnv[0]
		key := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, EnvPrefix)), "__", ".")
		return Config{}, unknownKeyErr(key, "environment variable "+name)
	}
	if fs != nil {
		if err := k.Load(posflag.ProviderWithFlag(fs, ".", k, func(f *pflag.Flag) (string, any) {
			if !known[f.Name] {
				return "", nil
			}
			return f.Name, posflag.FlagVal(fs, f)
		}), nil); err != nil {
			return Config{}, fmt.Errorf("config flags: %w", err)
		}
	}
	var cfg Config
	err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{
		Tag: "koanf",
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook: mapstructure.ComposeDecodeHookFunc(
				mapstructure.StringToTimeDurationHookFunc(),
				stringToSlice,
			),
			WeaklyTypedInput: true,
			ErrorUnused:      true,
			Result:           &cfg,
			TagName:          "koanf",
		},
	})
	if err != nil {
		return Config{}, decodeError(err)
	}
	if err := cfg.resolveSecrets(); err != nil { // "file:" values (secrets.go)
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// stringToSlice splits comma-separated strings (environment values) into
// lists, trimming spaces and dropping empty items.
func stringToSlice(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to.Kind() != reflect.Slice {
		return data, nil
	}
	var out []string
	for _, part := range strings.Split(data.(string), ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out, nil
}

// decodeError prefixes mapstructure's message, which names the key. Only
// typed fields (numbers, durations, booleans) can fail to decode, so no
// secret string is ever echoed.
func decodeError(err error) error {
	return fmt.Errorf("config: %w", err)
}

// Validate checks every section; the first error names its key.
func (c Config) Validate() error {
	for _, err := range []error{
		validateURL("database.url", c.Database.URL),
		validateURL("consumer.database.url", c.Consumer.Database.URL),
		validateAddr("api.listen", c.API.Listen, false),
		validateAddr("metrics.listen", c.Metrics.Listen, true),
		c.API.validate(),
		c.API.validateTokenHashes(),
		c.Log.validate(),
		c.Sink.validate(),
		validateRelay(c.Relay),
		c.Reconcile.validate(),
		c.Archive.validate(),
		c.Cleanup.validate(),
		c.Outbox.validate(),
		c.Retention.validate(),
		c.Consumer.validate(),
		c.Console.validate(),
		c.Tracing.validate(),
		validateCommandOwners(c.Sink),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// RequireDatabase reports a missing database.url.
func (c Config) RequireDatabase() error {
	if c.Database.URL == "" {
		return fieldErr("database.url", "is required (env POSTHORN_DATABASE__URL)")
	}
	return nil
}

// RequireConsumerDatabase reports a missing consumer.database.url.
func (c Config) RequireConsumerDatabase() error {
	if c.Consumer.Database.URL == "" {
		return fieldErr("consumer.database.url", "is required (env POSTHORN_CONSUMER__DATABASE__URL)")
	}
	return nil
}

func (a API) validate() error {
	for i, t := range a.Tokens {
		if strings.TrimSpace(t) == "" {
			return fieldErr(fmt.Sprintf("api.tokens[%d]", i), "is empty")
		}
		if len(t) < 16 {
			return fieldErr(fmt.Sprintf("api.tokens[%d]", i), "is shorter than 16 characters")
		}
	}
	return nil
}

func (l Log) validate() error {
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		return fieldErr("log.level", "is %q, want debug, info, warn or error", l.Level)
	}
	switch l.Format {
	case "auto", "json", "text":
	default:
		return fieldErr("log.format", "is %q, want auto, json or text", l.Format)
	}
	return nil
}

// validateURL accepts an empty value (the command that needs it says so)
// or a postgres:// URL or key=value DSN. Errors never include the value.
func validateURL(key, v string) error {
	if v == "" {
		return nil
	}
	if strings.Contains(v, "://") {
		u, err := url.Parse(v)
		if err != nil {
			return fieldErr(key, "is not a valid URL")
		}
		if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			return fieldErr(key, "has scheme %q, want postgres://", u.Scheme)
		}
		return nil
	}
	if !strings.Contains(v, "=") {
		return fieldErr(key, "is neither a postgres:// URL nor a key=value DSN")
	}
	return nil
}

func validateAddr(key, v string, optional bool) error {
	if v == "" {
		if optional {
			return nil
		}
		return fieldErr(key, "is required")
	}
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		return fieldErr(key, "is %q, want host:port", v)
	}
	return nil
}
