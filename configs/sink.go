package configs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/posthorn/posthorn/core"
)

// Sink selects and configures the broker the relay publishes to and the
// consumers read from.
type Sink struct {
	// Kind is one of SinkKinds.
	Kind     string       `koanf:"kind"`
	Kafka    KafkaSink    `koanf:"kafka"`
	NATS     NATSSink     `koanf:"nats"`
	AMQP     AMQPSink     `koanf:"amqp"`
	Redis    RedisSink    `koanf:"redis"`
	Postgres PostgresSink `koanf:"postgres"`
	// CommandTopicPrefix prefixes a command's service: commands.<service>.
	CommandTopicPrefix string `koanf:"command_topic_prefix"`
	// Format lays the records out on the wire: posthorn (the contract
	// headers alone), cloudevents or debezium-outbox (core.Formats).
	Format      string          `koanf:"format"`
	CloudEvents CloudEventsSink `koanf:"cloudevents"`
}

// CloudEventsSink configures sink.format cloudevents.
type CloudEventsSink struct {
	// Source is every record's ce_source: a URI reference naming this
	// outbox, e.g. /ledger/eu-1 or urn:bank:ledger.
	Source string `koanf:"source"`
}

// WireFormat returns the wire format sink.format and sink.cloudevents
// configure.
func (s Sink) WireFormat() core.WireFormat {
	return core.WireFormat{Format: core.Format(s.Format), Source: s.CloudEvents.Source}
}

// KafkaSink configures the Kafka sink.
type KafkaSink struct {
	Brokers []string `koanf:"brokers"`
	// TLS encrypts the broker connections (and authenticates the client
	// with cert_file/key_file).
	TLS SinkTLS `koanf:"tls"`
	// SASL authenticates the client (over TLS, please).
	SASL KafkaSASL `koanf:"sasl"`
	// Partitioner places a record key on a partition: murmur2 (the Java
	// client's placement, the default) or fnv1a (the placement of
	// Posthorn's sarama-based versions, for topics they wrote).
	Partitioner string `koanf:"partitioner"`
	// ExactlyOnce publishes each shard's batch in a Kafka transaction
	// fenced by the shard's lease, so read_committed readers see every
	// event once (Posthorn's own consumers need not: their inbox absorbs
	// the aborted copies a read_uncommitted reader receives).
	ExactlyOnce bool `koanf:"exactly_once"`
	// TransactionalIDPrefix starts the shards' transactional IDs with
	// exactly_once: the same for every relay of one outbox, different for
	// relays of different outboxes on one cluster.
	TransactionalIDPrefix string `koanf:"transactional_id_prefix"`
}

// KafkaPartitioners are the accepted values of sink.kafka.partitioner (the
// Kafka sink's own list; a cmd test keeps the two equal).
var KafkaPartitioners = []string{"murmur2", "fnv1a"}

// transactionalID is what sink.kafka.transactional_id_prefix may hold: the
// characters Kafka allows in a topic name, with room left for the shard.
var transactionalID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// KafkaSASL is the Kafka client's SASL authentication; an empty Mechanism
// means none.
type KafkaSASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `koanf:"mechanism"`
	Username  string `koanf:"username"`
	// Password is a secret: redacted, and may be "file:/path".
	Password string `koanf:"password"`
}

// KafkaSASLMechanisms are the accepted values of sink.kafka.sasl.mechanism.
var KafkaSASLMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

func (s KafkaSASL) validate() error {
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" {
			return fieldErr("sink.kafka.sasl.mechanism", "is required when sink.kafka.sasl.username or password is set (one of %v)", KafkaSASLMechanisms)
		}
		return nil
	}
	known := false
	for _, m := range KafkaSASLMechanisms {
		known = known || s.Mechanism == m
	}
	if !known {
		return fieldErr("sink.kafka.sasl.mechanism", "is %q, want one of %v", s.Mechanism, KafkaSASLMechanisms)
	}
	if s.Username == "" {
		return fieldErr("sink.kafka.sasl.username", "is required with sink.kafka.sasl.mechanism %s", s.Mechanism)
	}
	if s.Password == "" {
		return fieldErr("sink.kafka.sasl.password", "is required with sink.kafka.sasl.mechanism %s", s.Mechanism)
	}
	return nil
}

// NATSSink configures the NATS JetStream sink.
type NATSSink struct {
	URL string `koanf:"url"`
	// Username and Password, or Token, authenticate (or put them in the URL).
	Username string `koanf:"username"`
	Password string `koanf:"password"`
	Token    string `koanf:"token"`
	// SubjectPrefix is prepended to each topic to form its subject; each
	// subject has its own stream (the subject with '.' as '_').
	SubjectPrefix string  `koanf:"subject_prefix"`
	TLS           SinkTLS `koanf:"tls"`
}

// AMQPSink configures the RabbitMQ sink.
type AMQPSink struct {
	// URL is amqp:// or amqps://, with the vhost as its path.
	URL string `koanf:"url"`
	// Username and Password replace the URL's credentials when set.
	Username string `koanf:"username"`
	Password string `koanf:"password"`
	// ExchangePrefix is prepended to each topic to name its fanout exchange.
	ExchangePrefix string `koanf:"exchange_prefix"`
	// Consumers are the consumers whose durable queues the relay declares,
	// so that what is published before a consumer first starts waits for it.
	Consumers []string `koanf:"consumers"`
	// MaxPayloadBytes is the broker's max_message_size; 0 means 128 MiB.
	MaxPayloadBytes int     `koanf:"max_payload_bytes"`
	TLS             SinkTLS `koanf:"tls"`
	// CommandOwners maps a command service (commands.<service>) to the
	// consumer that owns it: the only queue the relay binds to that command
	// exchange. A service not listed is owned by the consumer named like it.
	CommandOwners map[string]string `koanf:"command_owners"`
}

// RedisSink configures the Redis Streams sink.
type RedisSink struct {
	Addr     string `koanf:"addr"`
	Username string `koanf:"username"`
	Password string `koanf:"password"`
	DB       int    `koanf:"db"`
	// StreamPrefix is prepended to each topic to form its stream key.
	StreamPrefix    string  `koanf:"stream_prefix"`
	MaxPayloadBytes int     `koanf:"max_payload_bytes"`
	TLS             SinkTLS `koanf:"tls"`
}

// PostgresSink configures the sink that writes into another Postgres database.
type PostgresSink struct {
	// URL is the target database; TLS through sslmode, sslrootcert, … in it.
	URL             string `koanf:"url"`
	MaxPayloadBytes int    `koanf:"max_payload_bytes"`
}

// SinkTLS is the TLS of a broker connection; all empty means the client's
// default (plain, unless the URL's scheme asks for TLS).
type SinkTLS struct {
	// CAFile is a PEM bundle of the CAs to trust instead of the system's.
	CAFile string `koanf:"ca_file"`
	// CertFile and KeyFile are a client certificate and key (mutual TLS).
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
	// InsecureSkipVerify turns certificate checks off (tests only).
	InsecureSkipVerify bool `koanf:"insecure_skip_verify"`
}

// Enabled reports whether any TLS setting is given.
func (t SinkTLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.InsecureSkipVerify
}

// Load builds the tls.Config (nil when nothing is set). key is the
// configuration key of t, for errors (e.g. sink.nats.tls).
func (t SinkTLS) Load(key string) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fieldErr(key+".ca_file", "cannot be read: %v", errors.Unwrap(err))
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fieldErr(key+".ca_file", "holds no PEM certificate")
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, fieldErr(key+".cert_file", "and %s.key_file must be set together", key)
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fieldErr(key+".cert_file", "with its key_file: %v", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// SinkKinds are the accepted values of sink.kind.
var SinkKinds = []string{"kafka", "memory", "nats", "amqp", "redis", "postgres"}

func defaultSink() Sink {
	return Sink{
		Kind:  "kafka",
		Kafka: KafkaSink{Brokers: []string{"127.0.0.1:9092"}, Partitioner: "murmur2", TransactionalIDPrefix: "posthorn-relay"},
		// The brokers' own local defaults, so `--sink nats` (amqp, redis)
		// works against a local server with nothing else set.
		NATS:               NATSSink{URL: "nats://127.0.0.1:4222"},
		AMQP:               AMQPSink{URL: "amqp://guest:guest@127.0.0.1:5672/", Consumers: []string{"balance-projection", "audit-log"}},
		Redis:              RedisSink{Addr: "127.0.0.1:6379"},
		CommandTopicPrefix: "commands.",
		Format:             string(core.FormatPosthorn),
		CloudEvents:        CloudEventsSink{Source: core.DefaultCloudEventsSource},
	}
}

func (s Sink) validate() error {
	known := false
	for _, k := range SinkKinds {
		known = known || s.Kind == k
	}
	if !known {
		return fieldErr("sink.kind", "is %q, want one of %v", s.Kind, SinkKinds)
	}
	if s.Kind == "kafka" && len(s.Kafka.Brokers) == 0 {
		return fieldErr("sink.kafka.brokers", "is required when sink.kind is kafka")
	}
	for i, b := range s.Kafka.Brokers {
		if err := validateAddr(fmt.Sprintf("sink.kafka.brokers[%d]", i), b, false); err != nil {
			return err
		}
	}
	if s.Kind == "kafka" {
		if !slices.Contains(KafkaPartitioners, s.Kafka.Partitioner) {
			return fieldErr("sink.kafka.partitioner", "is %q, want one of %v", s.Kafka.Partitioner, KafkaPartitioners)
		}
		if s.Kafka.ExactlyOnce && !transactionalID.MatchString(s.Kafka.TransactionalIDPrefix) {
			return fieldErr("sink.kafka.transactional_id_prefix", "is %q, want 1 to 200 letters, digits, '.', '_' or '-'", s.Kafka.TransactionalIDPrefix)
		}
		if err := s.Kafka.SASL.validate(); err != nil {
			return err
		}
		if _, err := s.Kafka.TLS.Load("sink.kafka.tls"); err != nil {
			return err
		}
	}
	if s.CommandTopicPrefix == "" {
		return fieldErr("sink.command_topic_prefix", "is required")
	}
	if !slices.Contains(core.Formats, core.Format(s.Format)) {
		return fieldErr("sink.format", "is %q, want one of %v", s.Format, core.Formats)
	}
	if s.Format == string(core.FormatCloudEvents) {
		if u, err := url.Parse(s.CloudEvents.Source); s.CloudEvents.Source == "" || err != nil || strings.ContainsAny(s.CloudEvents.Source, " \t\r\n") || u.String() != s.CloudEvents.Source {
			return fieldErr("sink.cloudevents.source", "is %.80q, want a URI reference (e.g. /ledger/eu-1 or urn:bank:ledger)", s.CloudEvents.Source)
		}
	}
	return s.validateBrokers()
}

// validateBrokers checks the settings of the broker sink.kind names (the
// others may hold anything: they are not used). Errors name the key and
// never quote a URL, which may hold a password.
func (s Sink) validateBrokers() error {
	switch s.Kind {
	case "nats":
		for _, u := range strings.Split(s.NATS.URL, ",") { // a server list is allowed
			if err := validateBrokerURL("sink.nats.url", strings.TrimSpace(u), "nats", "tls", "ws", "wss"); err != nil {
				return err
			}
		}
		if s.NATS.Token != "" && (s.NATS.Username != "" || s.NATS.Password != "") {
			return fieldErr("sink.nats.token", "and sink.nats.username/password are exclusive")
		}
		if strings.ContainsAny(s.NATS.SubjectPrefix, " \t*>") {
			return fieldErr("sink.nats.subject_prefix", "may not contain spaces, '*' or '>'")
		}
		_, err := s.NATS.TLS.Load("sink.nats.tls")
		return err
	case "amqp":
		if err := validateBrokerURL("sink.amqp.url", s.AMQP.URL, "amqp", "amqps"); err != nil {
			return err
		}
		for i, c := range s.AMQP.Consumers {
			if c == "" {
				return fieldErr(fmt.Sprintf("sink.amqp.consumers[%d]", i), "is empty")
			}
		}
		if s.AMQP.MaxPayloadBytes < 0 {
			return fieldErr("sink.amqp.max_payload_bytes", "is negative")
		}
		_, err := s.AMQP.TLS.Load("sink.amqp.tls")
		return err
	case "redis":
		if err := validateAddr("sink.redis.addr", s.Redis.Addr, false); err != nil {
			return err
		}
		if s.Redis.DB < 0 {
			return fieldErr("sink.redis.db", "is negative")
		}
		if s.Redis.MaxPayloadBytes < 0 {
			return fieldErr("sink.redis.max_payload_bytes", "is negative")
		}
		_, err := s.Redis.TLS.Load("sink.redis.tls")
		return err
	case "postgres":
		if s.Postgres.URL == "" {
			return fieldErr("sink.postgres.url", "is required when sink.kind is postgres")
		}
		if s.Postgres.MaxPayloadBytes < 0 {
			return fieldErr("sink.postgres.max_payload_bytes", "is negative")
		}
		return validateURL("sink.postgres.url", s.Postgres.URL)
	}
	return nil
}

// validateBrokerURL requires a URL with one of schemes and a host.
func validateBrokerURL(key, v string, schemes ...string) error {
	if v == "" {
		return fieldErr(key, "is required when sink.kind is %s", strings.Split(key, ".")[1])
	}
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		return fieldErr(key, "is not a valid URL (want %s://host:port)", schemes[0])
	}
	for _, sc := range schemes {
		if u.Scheme == sc {
			return nil
		}
	}
	return fieldErr(key, "has scheme %q, want one of %v", u.Scheme, schemes)
}
