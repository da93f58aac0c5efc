package amqp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	phamqp "github.com/posthorn/posthorn/adapters/amqp"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/amqptest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var topics = []string{core.TopicEvents, "commands.payouts"}

const reader = "sinktest"

// TestConformance runs the suite against the machine's RabbitMQ; the
// outage is a clean restart (rabbitmqctl stop, then start on the same data
// directory) of a dedicated node, so the machine's node is not disturbed.
// Only where no node can be started, it withdraws a test vhost's
// permissions and closes its connections, and says so.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		url := amqptest.SharedURL()
		var outage, kill func(*testing.T) func()
		if !testing.Short() && t.Name() == "TestConformance/"+sinktest.KillCase && amqptest.NodeUnavailable() == "" {
			n := amqptest.StartNode(t)
			url = n.URL
			kill = func(*testing.T) func() { n.Kill(); return n.StartAgain }
		}
		if !testing.Short() && t.Name() == "TestConformance/OutageIsRetryable" {
			if why := amqptest.NodeUnavailable(); why != "" {
				t.Logf("!!! OUTAGE IS SIMULATED (vhost permissions withdrawn), NOT A BROKER RESTART: no dedicated RabbitMQ node: %s", why)
				v := amqptest.NewVhost(t)
				url = v.URL
				outage = func(t *testing.T) func() { return v.Outage(t) }
			} else {
				n := amqptest.StartNode(t)
				url = n.URL
				outage = func(*testing.T) func() { n.Stop(); return n.StartAgain }
			}
		}
		cfg := phamqp.Config{URL: url, Consumers: []string{reader}, MaxPayloadBytes: 1 << 20,
			CommandOwners: map[string]string{"payouts": reader}}
		cfg.ExchangePrefix = amqptest.Prefix(t, url, topics, cfg.Consumers)
		return sinktest.Harness{
			Sink:     sinktest.Open(t, phamqp.New, cfg),
			Read:     readFunc(cfg),
			TooLarge: make([]byte, 2<<20),
			Outage:   outage,
			Kill:     kill,
		}
	})
}

// readFunc reads the reader's queue without acknowledging, so the records
// stay for the next read in their order, decoding with watermill-amqp's
// unmarshaler.
func readFunc(cfg phamqp.Config) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		u, _ := cfg.DialURL()
		conn, err := amqp.DialConfig(u, cfg.AMQPConfig())
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return nil, err
		}
		q := phamqp.Topology{ExchangePrefix: cfg.ExchangePrefix}.Queue(topic, reader)
		deliveries, err := ch.ConsumeWithContext(ctx, q, "", false, false, false, false, nil)
		if err != nil {
			return nil, err
		}
		var out []sinktest.Record
		for {
			quiet := time.After(300 * time.Millisecond)
			if len(out) < n {
				quiet = nil
			}
			select {
			case d := <-deliveries:
				msg, err := wmamqp.DefaultMarshaler{}.Unmarshal(d)
				if err != nil {
					return out, err
				}
				h := map[string]string{}
				for k, v := range msg.Metadata {
					h[k] = v
				}
				if h["event_id"] != msg.UUID || d.MessageId != msg.UUID || d.DeliveryMode != amqp.Persistent {
					h["event_id"] = "uuid " + msg.UUID + " message id " + d.MessageId + " != header " + h["event_id"]
				}
				out = append(out, sinktest.Record{Topic: topic, Headers: h, Payload: msg.Payload})
			case <-quiet:
				return out, nil
			case <-ctx.Done():
				return out, ctx.Err()
			}
		}
	}
}

// TestUnroutableIsNotAnAck: RabbitMQ confirms a record that no queue took
// (a fanout exchange with nothing bound drops it). Published mandatory, the
// broker returns it first, and the sink reports it as a retryable failure.
// Control: the same record with the consumer's queue declared is ACKed.
func TestUnroutableIsNotAnAck(t *testing.T) {
	url := amqptest.SharedURL()
	prefix := amqptest.Prefix(t, url, topics, []string{reader})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	bare := sinktest.Open(t, phamqp.New, phamqp.Config{URL: url, ExchangePrefix: prefix})
	err := bare.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-x", 1)})
	var be *core.BatchError
	if !errors.As(err, &be) || !errors.Is(be.Failed[0], phamqp.ErrUnroutable) || core.IsPermanent(be.Failed[0]) {
		t.Fatalf("publish to an exchange without queues: %v, want a retryable ErrUnroutable for record 0", err)
	}

	withQueue := sinktest.Open(t, phamqp.New, phamqp.Config{URL: url, ExchangePrefix: prefix, Consumers: []string{reader}})
	if err := withQueue.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-x", 1)}); err != nil {
		t.Fatalf("control: publish with the consumer's queue declared: %v", err)
	}
}

// On a command topic only the command's owner gets a queue: the event
// consumers' queues are bound to event exchanges alone.
// A service without a configured owner is owned by the consumer named
// like it.
func TestCommandExchangeRoutesOnlyToItsOwner(t *testing.T) {
	url := amqptest.SharedURL()
	consumers := []string{"balance-projection", "audit-log"}
	all := append([]string{"payouts-worker", "billing"}, consumers...)
	prefix := amqptest.Prefix(t, url, []string{core.TopicEvents, "commands.payouts", "commands.billing"}, all)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := sinktest.Open(t, phamqp.New, phamqp.Config{URL: url, ExchangePrefix: prefix, Consumers: consumers,
		CommandOwners: map[string]string{"payouts": "payouts-worker"}})
	if err := s.Publish(ctx, []core.Envelope{
		sinktest.Envelope(core.TopicEvents, "acc-x", 1),
		sinktest.Envelope("commands.payouts", "journal-1", 1),
		sinktest.Envelope("commands.billing", "journal-2", 1),
	}); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tp := phamqp.Topology{ExchangePrefix: prefix}
	messages := func(queue string) (int, bool) {
		ch, err := conn.Channel() // a failed passive declare closes the channel
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return 0, false
		}
		return q.Messages, true
	}
	for _, c := range consumers {
		if n, ok := messages(tp.Queue(core.TopicEvents, c)); !ok || n != 1 {
			t.Errorf("event queue of %s: %d messages (exists %v), want 1", c, n, ok)
		}
		for _, cmd := range []string{"commands.payouts", "commands.billing"} {
			if n, ok := messages(tp.Queue(cmd, c)); ok {
				t.Errorf("event consumer %s has a queue on %s (%d messages): commands must reach their owner only", c, cmd, n)
			}
		}
	}
	if n, ok := messages(tp.Queue("commands.payouts", "payouts-worker")); !ok || n != 1 {
		t.Errorf("owner payouts-worker: %d messages (exists %v), want 1", n, ok)
	}
	if n, ok := messages(tp.Queue("commands.billing", "billing")); !ok || n != 1 {
		t.Errorf("default owner billing: %d messages (exists %v), want 1", n, ok)
	}
}
