package nats_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// oldStreamName is the mapping earlier versions used: the subject with '.'
// (and the characters streams may not hold) replaced by '_'.
func oldStreamName(cfg phnats.Config, topic string) string {
	return strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_", "\t", "_", "/", "_", "\\", "_").Replace(cfg.Subject(topic))
}

func jetStream(t *testing.T, url string) nats.JetStreamContext {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// permanent is the failure Publish reported for the batch's only record,
// failing t unless it is permanent (the relay parks the aggregate).
func permanent(t *testing.T, err error) error {
	t.Helper()
	var be *core.BatchError
	if !errors.As(err, &be) || be.Failed[0] == nil || !core.IsPermanent(be.Failed[0]) {
		t.Fatalf("publish: %v; want the record failed for good", err)
	}
	return be.Failed[0]
}

// wallet.x and wallet_x get streams of their own, each holding its own
// record, and ordinary topics keep the names earlier versions gave them.
// Negative control: under the old mapping both topics name one stream, and
// a publish on the second topic's subject finds no stream (no responders),
// which the relay retried for ever.
func TestTopicsGetStreamsOfTheirOwn(t *testing.T) {
	t.Parallel()
	url := natstest.SharedURL()
	cfg := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	for _, topic := range []string{core.TopicEvents, "commands.payouts", "outbox.event.Account", "a-b:c"} {
		if got, old := cfg.StreamName(topic), oldStreamName(cfg, topic); got != old {
			t.Errorf("topic %s: stream %s, earlier versions used %s", topic, got, old)
		}
	}
	long := strings.Repeat("l", 300)
	names := map[string]string{}
	for _, topic := range []string{"wallet.x", "wallet_x", "wallet~x", "wallet/x", long, long + "2"} {
		name := cfg.StreamName(topic)
		if other, dup := names[name]; dup {
			t.Fatalf("topics %q and %q share stream %s", other, topic, name)
		}
		if len(name) > 255 || strings.ContainsAny(name, ". *>") {
			t.Fatalf("topic %.40q: stream name %q is not a valid stream name", topic, name)
		}
		names[name] = topic
	}

	s := sinktest.Open(t, phnats.New, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := sinktest.Envelope("wallet.x", "acc-1", 1), sinktest.Envelope("wallet_x", "acc-1", 1)
	if err := s.Publish(ctx, []core.Envelope{a}); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx, []core.Envelope{b}); err != nil {
		t.Fatal(err)
	}
	for _, e := range []core.Envelope{a, b} {
		recs, err := readFunc(cfg)(ctx, e.Topic, 1)
		if err != nil || len(recs) != 1 || recs[0].Headers[core.HeaderEventID] != e.EventID {
			t.Fatalf("topic %s holds %v (%v), want its own record only", e.Topic, recs, err)
		}
	}

	// Negative control: the old mapping, on the real server.
	old := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	if oldStreamName(old, "wallet.x") != oldStreamName(old, "wallet_x") {
		t.Fatal("negative control: the old mapping does not collide")
	}
	js := jetStream(t, url)
	if _, err := js.AddStream(&nats.StreamConfig{Name: oldStreamName(old, "wallet.x"), Subjects: []string{old.Subject("wallet.x")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(old.Subject("wallet_x"), []byte("x")); !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrNoStreamResponse) {
		t.Fatalf("negative control: wallet_x's subject next to the stream the old mapping shares: %v, want no responders", err)
	}
}

// A stream of the topic's name that captures another subject (made by an
// earlier version for another topic or prefix) is refused for good, naming
// the stream, so the aggregate parks. So is a wildcard topic, whose stream
// would capture the ledger's subject; and a subject another stream already
// captures. Negative control: the wildcard topic's stream, made as earlier
// versions made it, does capture ledger.events.
func TestForeignStreamsAndWildcardTopicsAreRefused(t *testing.T) {
	t.Parallel()
	url := natstest.SharedURL()
	js := jetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	cfg := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	// What an earlier version made for the topic ledger_events: a stream
	// named like ledger.events' one, on another subject.
	if _, err := js.AddStream(&nats.StreamConfig{Name: cfg.StreamName(core.TopicEvents), Subjects: []string{cfg.Subject("ledger_events")}}); err != nil {
		t.Fatal(err)
	}
	s := sinktest.Open(t, phnats.New, cfg)
	err := permanent(t, s.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-1", 1)}))
	if !errors.Is(err, phnats.ErrForeignStream) || !strings.Contains(err.Error(), cfg.StreamName(core.TopicEvents)) {
		t.Fatalf("error %v does not name the foreign stream", err)
	}
	// The topic ledger_events' stream is now named apart, but the old
	// stream captures its subject: refused too, until the operator moves
	// the old stream away (docs/sinks.md).
	err = permanent(t, s.Publish(ctx, []core.Envelope{sinktest.Envelope("ledger_events", "acc-1", 1)}))
	if !errors.Is(err, phnats.ErrForeignStream) || !strings.Contains(err.Error(), "captured by stream "+cfg.StreamName(core.TopicEvents)) {
		t.Fatalf("ledger_events beside its old stream: %v", err)
	}

	wild := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	ws := sinktest.Open(t, phnats.New, wild)
	for _, topic := range []string{"ledger.*", "ledger.>", "ledger..events", "ledger events"} {
		err := permanent(t, ws.Publish(ctx, []core.Envelope{sinktest.Envelope(topic, "acc-1", 1)}))
		if !errors.Is(err, phnats.ErrNotSubject) {
			t.Fatalf("topic %q: %v, want ErrNotSubject", topic, err)
		}
	}
	if err := ws.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-1", 1)}); err != nil {
		t.Fatalf("ledger.events after the refused wildcard topics: %v", err)
	}

	// Negative control: the stream earlier versions made for ledger.*
	// captures ledger.events, whose own stream then cannot be created.
	victim := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	if _, err := js.AddStream(&nats.StreamConfig{Name: oldStreamName(victim, "ledger.*"), Subjects: []string{victim.Subject("ledger.*")}}); err != nil {
		t.Fatal(err)
	}
	if owner, err := js.StreamNameBySubject(victim.Subject(core.TopicEvents)); err != nil || owner != oldStreamName(victim, "ledger.*") {
		t.Fatalf("negative control: ledger.events is captured by %q (%v), want the wildcard topic's stream", owner, err)
	}
	vs := sinktest.Open(t, phnats.New, victim)
	err = permanent(t, vs.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-1", 1)}))
	if !errors.Is(err, phnats.ErrForeignStream) || !strings.Contains(err.Error(), oldStreamName(victim, "ledger.*")) {
		t.Fatalf("a subject captured by another stream: %v, want ErrForeignStream naming it", err)
	}
}

// A topic's stream replaced, behind a running sink, by a foreign stream of
// the same name: the first publish finds no stream on the subject (no
// responders, retryable, as every publish was before the sink looked the
// stream up again), the next one is refused for good naming the stream,
// so the aggregate parks instead of the shard retrying for ever.
func TestStreamReplacedBehindTheSinkIsRefused(t *testing.T) {
	t.Parallel()
	url := natstest.SharedURL()
	js := jetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	s := sinktest.Open(t, phnats.New, cfg)
	if err := s.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-1", 1)}); err != nil {
		t.Fatal(err)
	}
	name := cfg.StreamName(core.TopicEvents)
	if err := js.DeleteStream(name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{cfg.Subject("elsewhere")}}); err != nil {
		t.Fatal(err)
	}
	err := s.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-1", 2)})
	var be *core.BatchError
	if !errors.As(err, &be) || core.IsPermanent(be.Failed[0]) {
		t.Fatalf("first publish after the swap: %v, want a retryable failure (no responders)", err)
	}
	err = permanent(t, s.Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-1", 2)}))
	if !errors.Is(err, phnats.ErrForeignStream) || !strings.Contains(err.Error(), name) {
		t.Fatalf("second publish: %v, want ErrForeignStream naming %s", err, name)
	}
}
