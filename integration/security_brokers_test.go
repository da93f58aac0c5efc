package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/amqptest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// brokerTLS writes httptest's certificate for 127.0.0.1 and its key as PEM
// files (the broker's server certificate, and the CA file its clients are
// given).
func brokerTLS(t *testing.T) (certFile, keyFile string, server *tls.Config) {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	cert := ts.TLS.Certificates[0]
	ts.Close()
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// startServer runs a dedicated broker process until the test ends and
// waits for its port.
func startServer(t *testing.T, port int, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	out, _ := os.Create(filepath.Join(t.TempDir(), filepath.Base(bin)+".log"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); out.Close() })
	open := wait.Until(15*time.Second, func() (bool, string) {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil, ""
	})
	if !open {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("%s did not open port %d:\n%s", bin, port, b)
	}
}

// tlsProxy terminates TLS on a free port and forwards to target (for the
// machine's RabbitMQ, which listens in plain only).
func tlsProxy(t *testing.T, server *tls.Config, target string) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

// brokerRoundTrip publishes n events through the relay's sink built from s
// and reads them back through a consumer's subscriber built from the same
// configuration. A failure to connect or publish is returned.
func brokerRoundTrip(t *testing.T, s brokers.Config, consumer string, n int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := brokers.OpenSink(s)
	if err != nil {
		return err
	}
	defer sink.Close()
	batch := make([]core.Envelope, n)
	for i := range batch {
		batch[i] = core.Envelope{EventID: fmt.Sprintf("0190b000-0000-7000-8000-%012d", i+1), Kind: core.KindEvent,
			Type: core.TypeAccountPosted, Topic: core.TopicEvents, AggregateType: core.AggregateAccount, AggregateID: "acc-sec",
			Revision: int64(i + 1), OccurredAt: time.Now(), Payload: []byte(`{}`)}
	}
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	if err := sink.Publish(pctx, batch); err != nil {
		return err
	}
	factory, err := brokers.Subscribers(s, brokers.Options{})
	if err != nil {
		return err
	}
	sub, err := factory(consumer)
	if err != nil {
		return err
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, core.TopicEvents)
	if err != nil {
		return err
	}
	for i := range n {
		select {
		case m := <-msgs:
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("read back %d of %d events", i, n)
		}
	}
	return nil
}

// TestSecurityBrokerCredentialsAndTLS: the relay's sink and the consumers'
// subscribers reach NATS (dedicated nats-server with TLS and a user), Redis
// (dedicated redis-server, TLS port only, requirepass) and RabbitMQ (the
// machine's broker behind a TLS terminator, guest's credentials) with the
// sink.<kind> credentials and TLS CA file. Controls per broker: a wrong
// password and a client without the CA are refused, and no error carries
// the password.
func TestSecurityBrokerCredentialsAndTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, serverTLS := brokerTLS(t)
	ca, err := configs.SinkTLS{CAFile: certFile}.Load("sink.tls")
	if err != nil {
		t.Fatal(err)
	}
	const natsPass, redisPass = "S3cret-nats-pw", "S3cret-redis-pw"

	natsPort := freePort(t)
	startServer(t, natsPort, "nats-server", "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", t.TempDir(),
		"--tls", "--tlscert", certFile, "--tlskey", keyFile, "--user", "posthorn", "--pass", natsPass)
	redisPort := freePort(t)
	startServer(t, redisPort, "redis-server", "--port", "0", "--tls-port", strconv.Itoa(redisPort), "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", certFile, "--tls-auth-clients", "no",
		"--requirepass", redisPass, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	amqpAddr := tlsProxy(t, serverTLS, "127.0.0.1:5672")
	amqpPrefix := amqptest.Prefix(t, amqptest.SharedURL(), []string{core.TopicEvents}, []string{"security-test"})

	var base brokers.Config
	cases := []struct {
		kind  string
		good  brokers.Config
		wrong func(brokers.Config) brokers.Config
	}{
		{"nats", func() brokers.Config {
			s := base
			s.Kind = "nats"
			s.NATS.URL = "tls://127.0.0.1:" + strconv.Itoa(natsPort)
			s.NATS.Username, s.NATS.Password, s.NATS.TLS = "posthorn", natsPass, ca
			return s
		}(), func(s brokers.Config) brokers.Config { s.NATS.Password = "S3cret-wrong"; return s }},
		{"redis", func() brokers.Config {
			s := base
			s.Kind = "redis"
			s.Redis.Addr = "127.0.0.1:" + strconv.Itoa(redisPort)
			s.Redis.Password, s.Redis.TLS = redisPass, ca
			return s
		}(), func(s brokers.Config) brokers.Config { s.Redis.Password = "S3cret-wrong"; return s }},
		{"amqp", func() brokers.Config {
			s := base
			s.Kind = "amqp"
			s.AMQP.URL = "amqps://" + amqpAddr + "/"
			s.AMQP.Username, s.AMQP.Password, s.AMQP.TLS = "guest", "guest", ca
			s.AMQP.ExchangePrefix, s.AMQP.Consumers = amqpPrefix, []string{"security-test"}
			return s
		}(), func(s brokers.Config) brokers.Config { s.AMQP.Password = "S3cret-wrong"; return s }},
	}
	for _, tc := range cases {
		t.Run(tc.kind, func(t *testing.T) {
			if err := brokerRoundTrip(t, tc.good, "security-test", 3); err != nil {
				t.Fatalf("with credentials and TLS: %v", err)
			}
			wrong := brokerRoundTrip(t, tc.wrong(tc.good), "security-test-wrong", 1)
			if wrong == nil {
				t.Error("control: a wrong password was accepted; the broker does not check credentials")
			} else if strings.Contains(wrong.Error(), "S3cret") {
				t.Errorf("the error shows the password: %v", wrong)
			}
			noCA := tc.good
			switch tc.kind {
			case "nats":
				noCA.NATS.TLS = nil
			case "redis":
				noCA.Redis.TLS = nil
			case "amqp":
				noCA.AMQP.TLS = nil
			}
			err := brokerRoundTrip(t, noCA, "security-test-noca", 1)
			var unknown x509.UnknownAuthorityError
			if err == nil {
				t.Error("control: a client without the CA file connected; TLS is not in use")
			} else if !errors.As(err, &unknown) && !strings.Contains(err.Error(), "certificate") && !strings.Contains(err.Error(), "tls") {
				t.Logf("without the CA (refused, not by the certificate check): %v", err)
			}
		})
	}
}
