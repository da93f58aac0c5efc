package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/amqptest"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/redistest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// brokerSinks are a configs.Sink per broker kind on this machine's
// servers, each in a namespace of its own.
func brokerSinks(t *testing.T) map[string]configs.Sink {
	base := configs.Default().Sink
	nats := base
	nats.Kind = "nats"
	nats.NATS.URL = natstest.SharedURL()
	nats.NATS.SubjectPrefix = natstest.Prefix(t, nats.NATS.URL)
	amqp := base
	amqp.Kind = "amqp"
	amqp.AMQP.URL = amqptest.SharedURL()
	amqp.AMQP.Consumers = []string{"c1"}
	amqp.AMQP.ExchangePrefix = amqptest.Prefix(t, amqp.AMQP.URL, []string{core.TopicEvents}, amqp.AMQP.Consumers)
	redis := base
	redis.Kind = "redis"
	redis.Redis.Addr = redistest.SharedAddr()
	redis.Redis.StreamPrefix = redistest.Prefix(t, redis.Redis.Addr)
	pg := base
	pg.Kind = "postgres"
	pg.Postgres.URL = pgtest.NewDatabase(t)
	return map[string]configs.Sink{"nats": nats, "amqp": amqp, "redis": redis, "postgres": pg}
}

// TestBrokerRoundTrip: a sink from openSink and a subscriber from
// openSubscribers, built from the same configs.Sink and nothing else,
// meet: the subscriber receives what the sink ACKed, with the event ID as
// message UUID, every contract header, in publish order per account — also
// when the subscriber starts after the events were published.
func TestBrokerRoundTrip(t *testing.T) {
	for kind, sc := range brokerSinks(t) {
		t.Run(kind, func(t *testing.T) {
			if err := configsValidate(sc); err != nil {
				t.Fatalf("configuration: %v", err)
			}
			sink, err := openSink(sc, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			var batch []core.Envelope
			for rev := int64(1); rev <= 10; rev++ {
				batch = append(batch, sinktest.Envelope(core.TopicEvents, "acc-a", rev), sinktest.Envelope(core.TopicEvents, "acc-b", rev))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := sink.Publish(ctx, batch); err != nil {
				t.Fatalf("publish: %v", err)
			}
			f, err := openSubscribers(sc, brokers.Options{})
			if err != nil {
				t.Fatal(err)
			}
			sub, err := f("c1")
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			msgs, err := sub.Subscribe(ctx, core.TopicEvents)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]core.Envelope{}
			for _, e := range batch {
				want[e.EventID] = e
			}
			last := map[string]int64{}
			for len(want) > 0 {
				select {
				case m := <-msgs:
					e, err := core.EnvelopeFromMessage(m)
					if err != nil {
						t.Fatalf("message %s: %v", m.UUID, err)
					}
					w, ok := want[m.UUID]
					if !ok || e.EventID != m.UUID || e.AggregateID != w.AggregateID || e.Revision != w.Revision || string(e.Payload) != string(w.Payload) {
						t.Fatalf("message %s: %+v, want %+v", m.UUID, e, w)
					}
					if e.Revision != last[e.AggregateID]+1 {
						t.Fatalf("%s: revision %d after %d", e.AggregateID, e.Revision, last[e.AggregateID])
					}
					last[e.AggregateID] = e.Revision
					delete(want, m.UUID)
					m.Ack()
				case <-ctx.Done():
					t.Fatalf("%d events not received", len(want))
				}
			}
		})
	}
}

func configsValidate(sc configs.Sink) error {
	c := configs.Default()
	c.Sink = sc
	return c.Validate()
}

// TestBrokerConfigErrorsNameTheKey: bad broker settings stop the command at
// start with an error naming the key, and never quote a password.
func TestBrokerConfigErrorsNameTheKey(t *testing.T) {
	for _, c := range []struct {
		env []string
		key string
	}{
		{[]string{"POSTHORN_SINK__KIND=nats", "POSTHORN_SINK__NATS__URL=http://u:hunter2@x:4222"}, "sink.nats.url"},
		{[]string{"POSTHORN_SINK__KIND=nats", "POSTHORN_SINK__NATS__URL="}, "sink.nats.url"},
		{[]string{"POSTHORN_SINK__KIND=nats", "POSTHORN_SINK__NATS__TLS__CA_FILE=/nonexistent/ca.pem"}, "sink.nats.tls.ca_file"},
		{[]string{"POSTHORN_SINK__KIND=nats", "POSTHORN_SINK__NATS__SUBJECT_PREFIX=a.*."}, "sink.nats.subject_prefix"},
		{[]string{"POSTHORN_SINK__KIND=nats", "POSTHORN_SINK__NATS__TOKEN=hunter2", "POSTHORN_SINK__NATS__USERNAME=u"}, "sink.nats.token"},
		{[]string{"POSTHORN_SINK__KIND=amqp", "POSTHORN_SINK__AMQP__URL=nats://guest:hunter2@127.0.0.1:5672/"}, "sink.amqp.url"},
		{[]string{"POSTHORN_SINK__KIND=amqp", "POSTHORN_SINK__AMQP__TLS__CERT_FILE=/x.pem"}, "sink.amqp.tls.cert_file"},
		{[]string{"POSTHORN_SINK__KIND=amqp", "POSTHORN_SINK__AMQP__MAX_PAYLOAD_BYTES=-1"}, "sink.amqp.max_payload_bytes"},
		{[]string{"POSTHORN_SINK__KIND=redis", "POSTHORN_SINK__REDIS__ADDR=localhost"}, "sink.redis.addr"},
		{[]string{"POSTHORN_SINK__KIND=redis", "POSTHORN_SINK__REDIS__DB=-2"}, "sink.redis.db"},
		{[]string{"POSTHORN_SINK__KIND=postgres"}, "sink.postgres.url"},
		{[]string{"POSTHORN_SINK__KIND=postgres", "POSTHORN_SINK__POSTGRES__URL=mysql://u:hunter2@h/db"}, "sink.postgres.url"},
	} {
		_, err := configs.Load("", c.env, nil)
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%v: error %v, want one naming %s", c.env, err, c.key)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v: error quotes the secret: %v", c.env, err)
		}
	}
	// The defaults of every broker kind validate: `--sink nats` needs nothing else.
	for _, kind := range []string{"nats", "amqp", "redis"} {
		if _, err := configs.Load("", []string{"POSTHORN_SINK__KIND=" + kind}, nil); err != nil {
			t.Errorf("sink.kind %s with defaults: %v", kind, err)
		}
	}
}

// TestBrokerSecretsRedacted: config print hides every broker secret.
func TestBrokerSecretsRedacted(t *testing.T) {
	cfg, err := configs.Load("", []string{
		"POSTHORN_SINK__KIND=nats",
		"POSTHORN_SINK__NATS__URL=nats://u:s1-secret@127.0.0.1:4222",
		"POSTHORN_SINK__NATS__PASSWORD=s2-secret",
		"POSTHORN_SINK__AMQP__URL=amqp://guest:s3-secret@127.0.0.1:5672/",
		"POSTHORN_SINK__AMQP__PASSWORD=s4-secret",
		"POSTHORN_SINK__REDIS__PASSWORD=s5-secret",
		"POSTHORN_SINK__POSTGRES__URL=postgres://u:s6-secret@127.0.0.1/db",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	printed := fmt.Sprintf("%+v", cfg.Redacted())
	if strings.Contains(printed, "-secret") {
		t.Fatalf("a secret survives redaction: %s", printed)
	}
	if !strings.Contains(fmt.Sprintf("%+v", cfg), "s2-secret") {
		t.Fatal("control: the unredacted configuration should hold the secret")
	}
	if cfg.Redacted().Sink.NATS.Token != "" {
		t.Fatal("an unset token must stay empty, not become REDACTED")
	}
}
