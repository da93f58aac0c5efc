package kafka_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// testTLS returns a server TLS config for 127.0.0.1 (httptest's built-in
// certificate) and a client config that trusts it.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	cert := ts.TLS.Certificates[0]
	leaf := ts.Certificate()
	ts.Close()
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

const (
	saslUser     = "posthorn-relay"
	saslPassword = "S3cret-scram-password"
)

func secureCluster(t *testing.T, serverTLS *tls.Config, extra ...kfake.Opt) (*kfake.Cluster, []kfake.Opt) {
	t.Helper()
	opts := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(4, core.TopicEvents, "commands.payouts"),
		kfake.AllowAutoTopicCreation(),
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", saslUser, saslPassword),
		kfake.TLS(serverTLS),
	}, extra...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, opts
}

// TestConformanceOverTLSAndSCRAM: the whole sink conformance suite, against
// a broker that accepts only TLS connections authenticated with
// SCRAM-SHA-512.
func TestConformanceOverTLSAndSCRAM(t *testing.T) {
	serverTLS, clientTLS := testTLS(t)
	readOpts := []kgo.Opt{kgo.DialTLSConfig(clientTLS), kgo.SASL(scram.Auth{User: saslUser, Pass: saslPassword}.AsSha512Mechanism())}
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		cluster, opts := secureCluster(t, serverTLS, kfake.DataDir(t.TempDir()))
		addrs := cluster.ListenAddrs()
		t.Cleanup(func() { cluster.Close() }) // the one started by Outage
		s, err := kafka.New(kafka.Config{Brokers: addrs, Security: kafka.Security{
			TLS: clientTLS, SASLMechanism: kafka.SASLSCRAMSHA512, SASLUser: saslUser, SASLPassword: saslPassword}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return sinktest.Harness{
			Sink:     s,
			Read:     ReadFunc(addrs, readOpts...),
			Keyed:    true,
			TooLarge: make([]byte, 2<<20),
			Outage:   restartOutage(&cluster, opts), // kafka_test.go
		}
	})
}

// The broker refuses a client with a wrong password, without SASL or
// without TLS (the controls of the test above: the broker really demands
// both), and the sink's error never carries the password.
func TestSecureBrokerRefusesWrongCredentials(t *testing.T) {
	t.Parallel()
	serverTLS, clientTLS := testTLS(t)
	cluster, _ := secureCluster(t, serverTLS)
	addrs := cluster.ListenAddrs()
	good := kafka.Security{TLS: clientTLS, SASLMechanism: kafka.SASLSCRAMSHA512, SASLUser: saslUser, SASLPassword: saslPassword}
	wrong := good
	wrong.SASLPassword = "S3cret-but-wrong"
	noSASL := kafka.Security{TLS: clientTLS}
	noTLS := good
	noTLS.TLS = nil
	env := core.Envelope{EventID: "0190a000-0000-7000-8000-0000000000aa", Kind: core.KindEvent, Type: core.TypeAccountPosted,
		Topic: core.TopicEvents, AggregateType: core.AggregateAccount, AggregateID: "acc-a", Revision: 1, OccurredAt: time.Now(), Payload: []byte(`{}`)}
	for _, tc := range []struct {
		name string
		sec  kafka.Security
		ok   bool
	}{
		{"right credentials", good, true},
		{"wrong password", wrong, false},
		{"no SASL", noSASL, false},
		{"no TLS", noTLS, false},
	} {
		// A refused client fails within the test's patience: connection
		// and request timeouts of 2 s, few retries.
		s, err := kafka.New(kafka.Config{Brokers: addrs, Security: tc.sec, ClientOpts: []kgo.Opt{
			kgo.DialTimeout(2 * time.Second), kgo.RequestRetries(1), kgo.RecordRetries(2), kgo.RecordDeliveryTimeout(8 * time.Second)}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = s.Publish(ctx, []core.Envelope{env})
		cancel()
		_ = s.Close()
		if tc.ok != (err == nil) {
			t.Errorf("%s: publish error %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && strings.Contains(err.Error(), "S3cret") {
			t.Errorf("%s: the error shows the password: %v", tc.name, err)
		}
	}
}
