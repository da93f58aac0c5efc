package kafka

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	kscram "github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/xdg-go/scram"
)

// SASL mechanisms Security accepts.
const (
	SASLPlain       = "PLAIN"
	SASLSCRAMSHA256 = "SCRAM-SHA-256"
	SASLSCRAMSHA512 = "SCRAM-SHA-512"
)

// Security is how a Kafka client (the sink's kgo producer, a consumer's
// sarama-based Watermill subscriber) connects: TLS and SASL authentication.
// The zero value is plaintext without authentication. It is shared by the
// sink and the subscribers so both ends of a deployment connect alike.
type Security struct {
	// TLS, when set, encrypts every broker connection.
	TLS *tls.Config
	// SASLMechanism is "" (none), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	SASLMechanism string
	SASLUser      string
	// SASLPassword is a secret; it is never part of an error.
	SASLPassword string
}

// ErrBadSASLMechanism is returned for an unknown SASL mechanism.
var ErrBadSASLMechanism = errors.New("kafka: unknown SASL mechanism (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")

// validate checks the SASL settings both clients need.
func (s Security) validate() error {
	if s.SASLMechanism == "" {
		return nil
	}
	switch s.SASLMechanism {
	case SASLPlain, SASLSCRAMSHA256, SASLSCRAMSHA512:
	default:
		return ErrBadSASLMechanism
	}
	if s.SASLUser == "" || s.SASLPassword == "" {
		return fmt.Errorf("kafka: SASL %s needs a user and a password", s.SASLMechanism)
	}
	return nil
}

// kgoOpts are the sink producer's TLS and SASL options (franz-go's own
// SASL mechanisms).
func (s Security) kgoOpts() ([]kgo.Opt, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	var opts []kgo.Opt
	if s.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(s.TLS.Clone()))
	}
	var m sasl.Mechanism
	switch s.SASLMechanism {
	case "":
		return opts, nil
	case SASLPlain:
		m = plain.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsMechanism()
	case SASLSCRAMSHA256:
		m = kscram.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsSha256Mechanism()
	case SASLSCRAMSHA512:
		m = kscram.Auth{User: s.SASLUser, Pass: s.SASLPassword}.AsSha512Mechanism()
	}
	return append(opts, kgo.SASL(m)), nil
}

// Apply sets a sarama client's (the consumers' subscriber's) TLS and SASL
// settings. SCRAM uses xdg-go/scram, the
// client sarama's own examples use.
func (s Security) Apply(sc *sarama.Config) error {
	if s.TLS != nil {
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = s.TLS
	}
	if err := s.validate(); err != nil || s.SASLMechanism == "" {
		return err
	}
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Handshake = true
	sc.Net.SASL.User = s.SASLUser
	sc.Net.SASL.Password = s.SASLPassword
	switch s.SASLMechanism {
	case SASLPlain:
		sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case SASLSCRAMSHA256:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha256.New)} }
	case SASLSCRAMSHA512:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha512.New)} }
	}
	return nil
}

// scramClient adapts xdg-go/scram's conversation to sarama.SCRAMClient.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		// xdg-go's errors name the SASLprep step, not the password.
		return fmt.Errorf("kafka: SCRAM client: %w", err)
	}
	c.conv = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }

func (c *scramClient) Done() bool { return c.conv.Done() }
