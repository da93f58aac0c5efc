package nats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the suite against the machine's NATS server, each
// subtest in its own subject namespace. The shared server cannot be taken
// down, so the outage check runs in TestConformanceDedicatedServer.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		return harness(t, natstest.SharedURL(), nil)
	})
}

// TestConformanceDedicatedServer runs the suite against a nats-server of
// its own, whose outage is a crash (SIGKILL) and a restart on the same port
// and JetStream store.
func TestConformanceDedicatedServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills nats-server processes")
	}
	sinktest.Run(t, func(t *testing.T) sinktest.Harness {
		srv := natstest.Start(t)
		h := harness(t, srv.URL, func(t *testing.T) func() {
			srv.Kill()
			return srv.StartAgain
		})
		h.Kill = h.Outage
		return h
	})
}

func harness(t *testing.T, url string, outage func(*testing.T) func()) sinktest.Harness {
	cfg := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url), ConnectTimeout: time.Second}
	return sinktest.Harness{
		Sink:     sinktest.Open(t, phnats.New, cfg),
		Read:     readFunc(cfg),
		TooLarge: make([]byte, 2<<20), // over the server's default max_payload of 1 MiB
		Outage:   outage,
	}
}

// readFunc reads a topic's stream from its first message with an ordered
// consumer of its own, decoding with watermill-nats' unmarshaler.
func readFunc(cfg phnats.Config) func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
	return func(ctx context.Context, topic string, n int) ([]sinktest.Record, error) {
		nc, err := nats.Connect(cfg.URL, cfg.Options()...)
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		js, err := nc.JetStream()
		if err != nil {
			return nil, err
		}
		var out []sinktest.Record
		// The stream may not exist yet if nothing was published to topic.
		var sub *nats.Subscription
		for sub == nil {
			sub, err = js.SubscribeSync(cfg.Subject(topic), nats.OrderedConsumer(), nats.DeliverAll())
			if err != nil {
				select {
				case <-ctx.Done():
					return nil, err
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		defer func() { _ = sub.Unsubscribe() }()
		// Read until n arrived and then until the stream is quiet, so a
		// duplicate would be seen.
		for {
			wait := 200 * time.Millisecond
			if len(out) < n {
				wait = time.Until(deadline(ctx))
			}
			m, err := sub.NextMsg(wait)
			if err != nil {
				if len(out) >= n {
					return out, nil
				}
				return out, err
			}
			msg, err := (&wmnats.NATSMarshaler{}).Unmarshal(m)
			if err != nil {
				return out, err
			}
			out = append(out, sinktest.MessageRecord(topic, msg))
		}
	}
}

func deadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(20 * time.Second)
}

// TestResendWithinDuplicateWindowIsDropped: the event ID is the
// Nats-Msg-Id, so JetStream keeps one copy of a record the relay resends
// within the stream's duplicate window (a lost PubAck), and still ACKs the
// resend. Control: a record with another event ID is stored.
func TestResendWithinDuplicateWindowIsDropped(t *testing.T) {
	url := natstest.SharedURL()
	cfg := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	s := sinktest.Open(t, phnats.New, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := sinktest.Envelope(core.TopicEvents, "acc-dup", 1)
	for range 2 {
		if err := s.Publish(ctx, []core.Envelope{e}); err != nil {
			t.Fatal(err)
		}
	}
	other := sinktest.Envelope(core.TopicEvents, "acc-dup", 2)
	if err := s.Publish(ctx, []core.Envelope{other}); err != nil {
		t.Fatal(err)
	}
	recs, err := readFunc(cfg)(ctx, core.TopicEvents, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Headers[core.HeaderEventID] != e.EventID || recs[1].Headers[core.HeaderEventID] != other.EventID {
		t.Fatalf("stream holds %d records %v, want %s once then %s", len(recs), recs, e.EventID, other.EventID)
	}
}

// TestRelaySizedBatch: a batch larger than the relay's default size (5,000)
// and than nats.go's default cap on pending async publishes (4,000) is
// ACKed whole.
func TestRelaySizedBatch(t *testing.T) {
	url := natstest.SharedURL()
	cfg := phnats.Config{URL: url, SubjectPrefix: natstest.Prefix(t, url)}
	s := sinktest.Open(t, phnats.New, cfg)
	var batch []core.Envelope
	for i := 1; i <= 6000; i++ {
		batch = append(batch, sinktest.Envelope(core.TopicEvents, fmt.Sprintf("acc-%d", i%100), int64(i/100+1)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Publish(ctx, batch); err != nil {
		t.Fatalf("publish of %d records: %v", len(batch), err)
	}
}
