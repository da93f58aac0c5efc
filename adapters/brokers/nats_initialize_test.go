package brokers_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/posthorn/posthorn/adapters/brokers"
	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// TestNATSSubscribeInitializeMakesTheSinksStream: a consumer's subscriber
// asked to initialise a topic before the relay first publishes to it (as
// Watermill's tooling does, message.SubscribeInitializer) makes the stream
// the sink makes, so the relay's records go through. The control is the
// embedded watermill-nats subscriber's own initialisation, which names the
// stream after the topic: under a subject prefix it captures the sink's
// subject, and the sink refuses the stream as foreign, permanently.
func TestNATSSubscribeInitializeMakesTheSinksStream(t *testing.T) {
	url := natstest.SharedURL()
	cfg := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url), ConnectTimeout: 2 * time.Second}
	publish := func(topic string) error {
		s, err := brokers.OpenSink(brokers.Config{Kind: "nats", NATS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return s.Publish(ctx, []core.Envelope{sinktest.Envelope(topic, "acc-init", 1)})
	}
	f, err := brokers.Subscribers(brokers.Config{Kind: "nats", NATS: cfg}, brokers.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := f("audit-log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	init, ok := sub.(message.SubscribeInitializer)
	if !ok {
		t.Fatalf("%T is no message.SubscribeInitializer", sub)
	}
	if err := init.SubscribeInitialize("init.ours"); err != nil {
		t.Fatal(err)
	}
	if err := publish("init.ours"); err != nil {
		t.Fatalf("publish after the subscriber initialised the topic: %v", err)
	}

	// Control: the embedded subscriber's own initialisation, on a topic of
	// this run (its stream, named after the topic, is outside the prefix
	// the shared server's cleanup removes).
	theirs := "init-theirs-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		nc, err := nats.Connect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		if js, err := nc.JetStream(); err == nil {
			_ = js.DeleteStream(theirs)
		}
	})
	embedded := brokers.EmbeddedNATSSubscriber(sub)
	if err := embedded.SubscribeInitialize(theirs); err != nil {
		t.Fatal(err)
	}
	err = publish(theirs)
	var be *core.BatchError
	if errors.As(err, &be) {
		err = be.Failed[0]
	}
	if !errors.Is(err, phnats.ErrForeignStream) || !core.IsPermanent(err) {
		t.Fatalf("publish after watermill-nats' own initialisation: %v, want a permanent ErrForeignStream: no control", err)
	}
}
