// Package sinktest is the conformance suite every core.Sink must pass before
// the relay may use it, in the manner of Watermill's pubsub/tests: run it
// once per adapter with a Factory that starts a fresh sink and a way to read
// back, through the broker, what was published.
//
// What it proves:
//   - a batch is delivered whole, per aggregate in batch order, across topics;
//   - the event ID, every contract header, extra headers, the headers of
//     each wire format (core.Formats), the payload and (for keyed brokers)
//     the record key = aggregate ID survive the trip;
//   - Publish returns nil only for records the broker has: after a nil
//     return, a reader finds every record; during an outage Publish fails;
//   - failures are classified by core.IsPermanent: a record the broker can
//     never take is permanent and reported per record in *core.BatchError
//     while the rest of the batch is delivered, except the later records of
//     the same aggregate, which fail retryably and are not delivered (no
//     record may overtake its predecessor); an outage is retryable;
//   - Close is idempotent and Publish after Close fails without panicking;
//   - where the harness can SIGKILL the broker, every record ACKed while it
//     was killed and restarted mid-batch is on the broker, in order per
//     key (kills.go).
package sinktest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// Record is one record read back from the broker.
type Record struct {
	Topic   string
	Key     string
	Headers map[string]string
	Payload []byte
}

// MessageRecord is the Record of a Watermill message read back from topic
// (a broker without record keys). A message UUID that differs from its
// event_id header makes the header say so, so the header checks fail on it.
func MessageRecord(topic string, msg *message.Message) Record {
	h := make(map[string]string, len(msg.Metadata))
	for k, v := range msg.Metadata {
		h[k] = v
	}
	if h[core.HeaderEventID] != msg.UUID {
		h[core.HeaderEventID] = "uuid " + msg.UUID + " != header " + h[core.HeaderEventID]
	}
	return Record{Topic: topic, Headers: h, Payload: msg.Payload}
}

// Harness is one sink under test and its broker-side helpers.
type Harness struct {
	Sink core.Sink
	// Read returns every record on topic from the beginning, waiting until at
	// least n are there or ctx ends (then it returns what it has and an error).
	Read func(ctx context.Context, topic string, n int) ([]Record, error)
	// Keyed says the broker has record keys; the key must be the aggregate ID.
	Keyed bool
	// TooLarge is a payload the broker rejects for good; nil skips the test.
	TooLarge []byte
	// Outage makes the broker unreachable and returns a function that brings
	// it back; nil skips the outage checks.
	Outage func(t *testing.T) (restore func())
	// Kill ends the broker's process with SIGKILL, as a crash would, and
	// returns a function that starts it again on the same data; nil skips
	// the broker-kill case (kills.go).
	Kill func(t *testing.T) (restart func())
	// KillOptions shape the broker-kill case (zero: its defaults).
	KillOptions KillOptions
}

// Open returns the sink newSink builds from cfg, failing t when it cannot,
// and closes it when t ends. Close is idempotent (the Close case checks it),
// so a test may still close the sink itself earlier.
func Open[C any, S core.Sink](t testing.TB, newSink func(C) (S, error), cfg C) S {
	t.Helper()
	s, err := newSink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Factory starts a fresh broker (or a fresh namespace on one) and sink for
// one subtest; it registers its own cleanup with t.
type Factory func(t *testing.T) Harness

// Run runs every conformance test against sinks built by f.
func Run(t *testing.T, f Factory) {
	t.Run("BatchDelivery", func(t *testing.T) { testBatchDelivery(t, f(t)) })
	t.Run("HeadersKeyAndPayload", func(t *testing.T) { testHeaders(t, f(t)) })
	t.Run("AckMeansBrokerHasIt", func(t *testing.T) { testAck(t, f(t)) })
	t.Run("PermanentFailureIsPerRecord", func(t *testing.T) { testPermanent(t, f(t)) })
	t.Run("OutageIsRetryable", func(t *testing.T) { testOutage(t, f(t)) })
	t.Run("RepeatsReachTheConsumer", func(t *testing.T) { testRepeatsReachTheConsumer(t, f(t)) })
	t.Run("Close", func(t *testing.T) { testClose(t, f(t)) })
	t.Run(KillCase, func(t *testing.T) { testKills(t, f) })
}

// Envelope returns a valid test envelope of aggregate agg at revision rev.
func Envelope(topic, agg string, rev int64) core.Envelope {
	return core.Envelope{
		EventID:       uuid.Must(uuid.NewV7()).String(),
		Kind:          core.KindEvent,
		Type:          core.TypeAccountPosted,
		Topic:         topic,
		AggregateType: core.AggregateAccount,
		AggregateID:   agg,
		Revision:      rev,
		JournalID:     "0190a000-0000-7000-8000-00000000beef",
		OccurredAt:    time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC),
		Payload:       []byte(fmt.Sprintf(`{"account":%q,"revision":%d}`, agg, rev)),
	}
}

func read(t *testing.T, h Harness, topic string, n int) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recs, err := h.Read(ctx, topic, n)
	if err != nil {
		t.Fatalf("read %d records of %s back: got %d: %v", n, topic, len(recs), err)
	}
	return recs
}

func publish(t *testing.T, h Harness, batch []core.Envelope) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return h.Sink.Publish(ctx, batch)
}

func testBatchDelivery(t *testing.T, h Harness) {
	const perAgg = 25
	aggs := []string{"acc-a", "acc-b", "acc-c", "acc-d"}
	var batch []core.Envelope
	for rev := int64(1); rev <= perAgg; rev++ {
		for _, a := range aggs {
			batch = append(batch, Envelope(core.TopicEvents, a, rev))
		}
	}
	batch = append(batch, Envelope("commands.payouts", "journal-1", 1), Envelope("commands.payouts", "journal-1", 2))
	if err := publish(t, h, batch); err != nil {
		t.Fatalf("publish: %v", err)
	}
	recs := read(t, h, core.TopicEvents, perAgg*len(aggs))
	if len(recs) != perAgg*len(aggs) {
		t.Fatalf("read %d records, want %d (duplicates?)", len(recs), perAgg*len(aggs))
	}
	next := map[string]int64{}
	for _, r := range recs {
		e, err := core.EnvelopeFromHeaders(r.Headers, r.Payload)
		if err != nil {
			t.Fatalf("record: %v", err)
		}
		if e.Revision != next[e.AggregateID]+1 {
			t.Fatalf("%s: revision %d after %d: per-aggregate order broken", e.AggregateID, e.Revision, next[e.AggregateID])
		}
		next[e.AggregateID] = e.Revision
	}
	cmds := read(t, h, "commands.payouts", 2)
	if len(cmds) != 2 || cmds[0].Headers[core.HeaderRevision] != "1" {
		t.Fatalf("commands topic: %+v", cmds)
	}
}

// testHeaders publishes one record in each wire format (core.Formats) and
// reads each back: its headers (the contract's and those its format adds),
// payload and key survive the trip. The formats' topic routing is the
// relay's, not the sink's: every record here goes to one topic.
func testHeaders(t *testing.T, h Harness) {
	var batch []core.Envelope
	for i, f := range core.Formats {
		e := Envelope(core.TopicEvents, "acc-headers-"+string(f), int64(7+i))
		e.Headers = map[string]string{"reference": "inv-2026-0042"}
		e.Payload = []byte{0, 1, 2, 255, '{'}
		e = core.WireFormat{Format: f, Source: "/sinktest"}.Apply(e)
		e.Topic = core.TopicEvents
		batch = append(batch, e)
	}
	if err := publish(t, h, batch); err != nil {
		t.Fatalf("publish: %v", err)
	}
	byID := map[string]Record{}
	for _, r := range read(t, h, core.TopicEvents, len(batch)) {
		byID[r.Headers[core.HeaderEventID]] = r
	}
	for i, e := range batch {
		r, ok := byID[e.EventID]
		if !ok {
			t.Errorf("format %s: record %s not read back", core.Formats[i], e.EventID)
			continue
		}
		checkRecord(t, h, string(core.Formats[i]), e, r)
	}
}

// checkRecord compares record r, read back, with e, which was published.
func checkRecord(t *testing.T, h Harness, format string, e core.Envelope, r Record) {
	t.Helper()
	for k, v := range e.WireHeaders() {
		if r.Headers[k] != v {
			t.Errorf("format %s: header %s = %q, want %q", format, k, r.Headers[k], v)
		}
	}
	if _, ok := r.Headers[core.HeaderReplay]; ok {
		t.Errorf("format %s: header replay present on a non-replay record", format)
	}
	if string(r.Payload) != string(e.Payload) {
		t.Errorf("format %s: payload %q, want %q", format, r.Payload, e.Payload)
	}
	if h.Keyed && r.Key != e.AggregateID {
		t.Errorf("format %s: key %q, want the aggregate ID %q", format, r.Key, e.AggregateID)
	}
	got, err := core.EnvelopeFromHeaders(r.Headers, r.Payload)
	if err != nil || got.EventID != e.EventID || !got.OccurredAt.Equal(e.OccurredAt) {
		t.Errorf("format %s: envelope back: %+v, %v", format, got, err)
	}
}

func testAck(t *testing.T, h Harness) {
	// A cancelled context must not be answered with an ACK.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Sink.Publish(ctx, []core.Envelope{Envelope(core.TopicEvents, "acc-cancelled", 1)}); err == nil {
		t.Errorf("Publish with a cancelled context returned nil")
	}
	// After a nil return, every record is there to be read, in a fresh read.
	const n = 200
	var batch []core.Envelope
	for i := 1; i <= n; i++ {
		batch = append(batch, Envelope(core.TopicEvents, "acc-ack-"+strconv.Itoa(i%7), int64(i)))
	}
	if err := publish(t, h, batch); err != nil {
		t.Fatalf("publish: %v", err)
	}
	ids := map[string]bool{}
	for _, r := range read(t, h, core.TopicEvents, n) {
		ids[r.Headers[core.HeaderEventID]] = true
	}
	for _, e := range batch {
		if !ids[e.EventID] {
			t.Fatalf("event %s ACKed but not in the broker", e.EventID)
		}
	}
}

func testPermanent(t *testing.T, h Harness) {
	if h.TooLarge == nil {
		t.Skip("sink has no permanent-failure trigger")
	}
	big := Envelope(core.TopicEvents, "acc-big", 1)
	big.Payload = h.TooLarge
	batch := []core.Envelope{Envelope(core.TopicEvents, "acc-small", 1), big,
		Envelope(core.TopicEvents, "acc-big", 2), Envelope(core.TopicEvents, "acc-small", 2)}
	err := publish(t, h, batch)
	var be *core.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("publish with a too-large record: %v, want *core.BatchError", err)
	}
	if !core.IsPermanent(be.Failed[1]) {
		t.Fatalf("too-large record: %v, want a permanent error", be.Failed[1])
	}
	if core.IsPermanent(err) {
		t.Errorf("the batch error as a whole must not be permanent: only record 1 is")
	}
	// The big aggregate's next record must not overtake it: it fails too,
	// retryably (it is fine; it waits for its predecessor).
	if be.Failed[2] == nil || core.IsPermanent(be.Failed[2]) {
		t.Fatalf("record after the rejected one of the same aggregate: %v, want a retryable failure", be.Failed[2])
	}
	if len(be.Failed) != 2 {
		t.Fatalf("failed records %v, want records 1 and 2", be.Failed)
	}
	recs := read(t, h, core.TopicEvents, 2)
	if len(recs) != 2 || recs[0].Headers[core.HeaderAggregateID] != "acc-small" {
		t.Fatalf("the good records of the batch: %+v", recs)
	}
}

func testOutage(t *testing.T, h Harness) {
	if h.Outage == nil {
		t.Skip("harness cannot cause an outage")
	}
	if err := publish(t, h, []core.Envelope{Envelope(core.TopicEvents, "acc-outage", 1)}); err != nil {
		t.Fatalf("publish before the outage: %v", err)
	}
	restore := h.Outage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := h.Sink.Publish(ctx, []core.Envelope{Envelope(core.TopicEvents, "acc-outage", 2)})
	cancel()
	if err == nil {
		t.Fatalf("Publish during an outage returned nil: an ACK without a broker")
	}
	if core.IsPermanent(err) {
		t.Fatalf("outage classified permanent: %v", err)
	}
	var be *core.BatchError
	if errors.As(err, &be) {
		for i, e := range be.Failed {
			if core.IsPermanent(e) {
				t.Fatalf("outage: record %d classified permanent: %v", i, e)
			}
		}
	}
	restore()
	// The sink recovers by itself: keep retrying (as the relay does) until it
	// publishes again.
	wait.ForStatus(t, 30*time.Second, "the sink to recover after the outage", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = h.Sink.Publish(ctx, []core.Envelope{Envelope(core.TopicEvents, "acc-outage", 2)})
		cancel()
		return err == nil, fmt.Sprint(err)
	})
	recs := read(t, h, core.TopicEvents, 2)
	last := recs[len(recs)-1]
	if last.Headers[core.HeaderRevision] != "2" {
		t.Fatalf("after recovery, last record is revision %s", last.Headers[core.HeaderRevision])
	}
}

func testClose(t *testing.T, h Harness) {
	if err := publish(t, h, []core.Envelope{Envelope(core.TopicEvents, "acc-close", 1)}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := h.Sink.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := h.Sink.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("Publish after Close panicked: %v", r)
			}
		}()
		if err := publish(t, h, []core.Envelope{Envelope(core.TopicEvents, "acc-close", 2)}); err == nil {
			t.Errorf("Publish after Close returned nil")
		}
	}()
}
