package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/adapters/tracing"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/tracingtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/publish"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
	"github.com/posthorn/posthorn/relay/polling"
)

// The caller of the Posting API in these tests sends this traceparent: the
// posting's trace is the caller's.
const (
	callerTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID      = "00f067aa0ba902b7"
	callerTraceparent = "00-" + callerTraceID + "-" + callerSpanID + "-01"
)

// traceRig is the whole path of one posting over real parts: the Posting
// API on a fresh ledger, the relay to a kfake broker over sockets through
// the Kafka sink, and the balance projection reading it with the Kafka
// subscriber into its own database. tp nil is tracing off, wired as cmd
// wires it (tracing.Sink returns the bare sink); exactlyOnce selects the
// Kafka sink's exactly-once mode (a relay.FencedSink).
type traceRig struct {
	pool   *pgxpool.Pool
	broker *relayBroker
	sink   core.Sink
	apiURL string
	tp     trace.TracerProvider
}

func newTraceRig(t *testing.T, tp trace.TracerProvider, exactlyOnce bool) *traceRig {
	t.Helper()
	_, pool := pgtest.Ledger(t)
	b := startRelayBroker(t)
	var inner core.Sink
	if exactlyOnce {
		inner = newExactlyOnceSink(t, b.addrs)
	} else {
		inner = newKafkaSink(t, b.addrs)
	}
	return newTraceRigOn(t, pool, b, inner, tp)
}

// newTraceRigOn is the rig's API on pool, publishing to inner (on broker
// b, nil for a sink without one).
func newTraceRigOn(t *testing.T, pool *pgxpool.Pool, b *relayBroker, inner core.Sink, tp trace.TracerProvider) *traceRig {
	t.Helper()
	srv, err := api.New(api.Config{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp},
		ledgerstore.New(pool, ledgerstore.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &traceRig{pool: pool, broker: b, sink: tracing.Sink(inner, tp, "kafka"), apiURL: ts.URL, tp: tp}
}

// post sends one posting of two lines and a command with the caller's
// traceparent and returns the API's answer.
func (r *traceRig) post(t *testing.T) core.PostingResult {
	t.Helper()
	body := `{"entries":[
		{"account":"acc-alice","direction":"debit","amount":"1250","currency":"EUR"},
		{"account":"acc-bob","direction":"credit","amount":"1250","currency":"EUR"}],
		"commands":[{"type":"payouts.payout.execute","payload":{"beneficiary":"acc-bob"}}]}`
	req, err := http.NewRequest(http.MethodPost, r.apiURL+"/v1/postings", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "trace-posting-1")
	req.Header.Set("traceparent", callerTraceparent)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("posting answered %s", res.Status)
	}
	var out core.PostingResult
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// startConsumer runs the balance projection on the rig's broker.
func (r *traceRig) startConsumer(t *testing.T) *consumerRig {
	t.Helper()
	tr := consumerTransport{name: "kfake", subscriber: func(t *testing.T, consumer string, _ int) message.Subscriber {
		sub, err := kafkagroup.Subscriber(r.broker.addrs, consumer, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}}
	return startConsumer(t, tr, smallConsumerPool(t), rigOptions{tracer: r.tp})
}

// rowHeaders are the headers column of every outbox row, by event ID.
func (r *traceRig) rowHeaders(t *testing.T) map[string]map[string]string {
	t.Helper()
	ids := pgtest.Column[string](t, r.pool, `SELECT event_id::text FROM outbox ORDER BY id`)
	raw := pgtest.Column[[]byte](t, r.pool, `SELECT headers FROM outbox ORDER BY id`)
	out := make(map[string]map[string]string, len(ids))
	for i, id := range ids {
		h := map[string]string{}
		if err := json.Unmarshal(raw[i], &h); err != nil {
			t.Fatal(err)
		}
		out[id] = h
	}
	return out
}

// spanOf is the span context a trace-context header map carries.
func spanOf(h map[string]string) trace.SpanContext {
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(h)))
}

// spansBy groups the ended spans whose name starts with prefix by their
// messaging.message.id.
func spansBy(exp *tracetest.InMemoryExporter, prefix string) map[string][]tracetest.SpanStub {
	out := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if !strings.HasPrefix(s.Name, prefix) {
			continue
		}
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" {
				out[a.Value.AsString()] = append(out[a.Value.AsString()], s)
			}
		}
	}
	return out
}

func spanIDs(spans []tracetest.SpanStub) []trace.SpanID {
	ids := make([]trace.SpanID, len(spans))
	for i, s := range spans {
		ids[i] = s.SpanContext.SpanID()
	}
	return ids
}

// TestOneTraceFromAPIToConsumer: one posting is one trace, the caller's.
// The API span continues the caller's traceparent; every outbox row of the
// posting stores the API span; every publish span is the API span's child;
// each record carries its own publish span, not the row's; each consumer
// apply span is the child of the publish span of the record it received.
// After a relay crash between the ACK and the marker the successor relay
// publishes the rows again, and an operator's resend once more: each is a
// new publish span in the same trace, child of the API span, and the
// consumer's apply span of each repeat (a duplicate) is its child.
func TestOneTraceFromAPIToConsumer(t *testing.T) {
	t.Parallel()
	tp, exp := tracingtest.Memory(t)
	r := newTraceRig(t, tp, false)
	cons := r.startConsumer(t)
	res := r.post(t)
	events := []string{res.Events[0].EventID, res.Events[1].EventID}

	// The API span continues the caller.
	var apiSpan tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "POST /v1/postings" {
			apiSpan = s
		}
	}
	if !apiSpan.SpanContext.IsValid() {
		t.Fatal("no API span recorded")
	}
	traceID := apiSpan.SpanContext.TraceID()
	if traceID.String() != callerTraceID || apiSpan.Parent.SpanID().String() != callerSpanID {
		t.Fatalf("API span in trace %s with parent %s, want the caller's %s / %s", traceID, apiSpan.Parent.SpanID(), callerTraceID, callerSpanID)
	}

	// Every row of the posting, the command's too, stores the API span.
	rows := r.rowHeaders(t)
	if len(rows) != 3 {
		t.Fatalf("%d outbox rows, want 2 events and 1 command", len(rows))
	}
	for id, h := range rows {
		if sc := spanOf(h); sc.TraceID() != traceID || sc.SpanID() != apiSpan.SpanContext.SpanID() {
			t.Fatalf("row %s stores trace context %v (headers %v), want the API span %s", id, sc, h, apiSpan.SpanContext.SpanID())
		}
	}

	// The first relay crashes after the broker's ACK, before the marker;
	// the second takes the expired leases over and publishes again.
	var crashed atomic.Bool
	first, _ := startTestRelay(t, r.pool, r.sink, "relay-crashes", "kafka", &polling.Hooks{AfterAck: func([]core.Envelope) error {
		crashed.Store(true)
		return errors.New("crash between ACK and marker")
	}})
	select {
	case <-first.Stopped():
	case <-time.After(30 * time.Second):
		t.Fatal("the first relay did not crash")
	}
	if !crashed.Load() {
		t.Fatal("the first relay stopped without an ACK")
	}
	startTestRelay(t, r.pool, r.sink, "relay-takes-over", "kafka")
	wait.ForStatus(t, 30*time.Second, "the successor to publish every row again", func() (bool, string) {
		got := spansBy(exp, "publish ")
		return len(got[events[0]]) >= 2 && len(got[events[1]]) >= 2, fmt.Sprintf("publish spans %d, %d", len(got[events[0]]), len(got[events[1]]))
	})
	// An operator resends the first event.
	if _, err := ops.Resend(context.Background(), ops.ResendConfig{Ledger: opsstore.New(r.pool), Sink: r.sink, EventIDs: events[:1]}); err != nil {
		t.Fatal(err)
	}
	publishes := map[string]int{events[0]: 3, events[1]: 2}
	wait.ForStatus(t, 30*time.Second, "an apply span for every record", func() (bool, string) {
		got := spansBy(exp, "apply "+projection.Name)
		return len(got[events[0]]) >= publishes[events[0]] && len(got[events[1]]) >= publishes[events[1]],
			fmt.Sprintf("apply spans %d, %d", len(got[events[0]]), len(got[events[1]]))
	})

	publish := spansBy(exp, "publish ")
	apply := spansBy(exp, "apply "+projection.Name)
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %q is in trace %s, not the posting's %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
	}
	recs := r.broker.recordsHolding(events, 20*time.Second)
	for _, id := range events {
		pubs := publish[id]
		if len(pubs) != publishes[id] {
			t.Errorf("event %s has %d publish spans, want %d (crash, takeover%s)", id, len(pubs), publishes[id], map[bool]string{true: ", resend"}[publishes[id] == 3])
		}
		pubIDs := spanIDs(pubs)
		for _, p := range pubs {
			if p.Parent.SpanID() != apiSpan.SpanContext.SpanID() || p.SpanKind != trace.SpanKindProducer {
				t.Errorf("publish span %s of %s has parent %s (kind %v), want the API span %s", p.SpanContext.SpanID(), id, p.Parent.SpanID(), p.SpanKind, apiSpan.SpanContext.SpanID())
			}
		}
		distinct := map[trace.SpanID]bool{}
		for _, sid := range pubIDs {
			distinct[sid] = true
		}
		if len(distinct) != len(pubIDs) {
			t.Errorf("event %s: a repeat reused a publish span: %v", id, pubIDs)
		}
		// Each record carries one of its event's publish spans, never the
		// row's API span, and each publish its own record.
		var carried []trace.SpanID
		for _, rec := range recs {
			h := headers(rec)
			if h[core.HeaderEventID] != id {
				continue
			}
			sc := spanOf(h)
			if !slices.Contains(pubIDs, sc.SpanID()) {
				t.Errorf("a record of %s carries span %s, not one of its publish spans %v", id, sc.SpanID(), pubIDs)
			}
			carried = append(carried, sc.SpanID())
		}
		if len(carried) != len(pubs) {
			t.Errorf("event %s: %d records for %d publish spans", id, len(carried), len(pubs))
		}
		applied := 0
		for _, a := range apply[id] {
			if !slices.Contains(pubIDs, a.Parent.SpanID()) || a.SpanKind != trace.SpanKindConsumer {
				t.Errorf("apply span of %s has parent %s (kind %v), not one of its publish spans %v", id, a.Parent.SpanID(), a.SpanKind, pubIDs)
			}
			for _, kv := range a.Attributes {
				if kv.Key == "posthorn.disposition" && kv.Value.AsString() == string(core.DispositionApplied) {
					applied++
				}
			}
		}
		if applied != 1 {
			t.Errorf("event %s has %d apply spans with disposition applied, want 1 (the repeats are duplicates)", id, applied)
		}
	}
	if n := counts(t, cons.pool, projection.Name).Events[core.DispositionApplied]; n != 2 {
		t.Errorf("the projection applied %d events, want 2", n)
	}
}

// TestOneTraceExactlyOnce: through the exactly-once Kafka sink (the
// decorator must stay a FencedSink, or the relay refuses it) an ACK-then-
// crash is not published again (the successor's fence marks the committed
// rows), so each event has one publish span, the API span's child, and its
// one committed record carries that span.
func TestOneTraceExactlyOnce(t *testing.T) {
	t.Parallel()
	tp, exp := tracingtest.Memory(t)
	r := newTraceRig(t, tp, true)
	if _, ok := r.sink.(relay.FencedSink); !ok {
		t.Fatal("the traced exactly-once sink is not a FencedSink")
	}
	res := r.post(t)
	first, _ := startTestRelay(t, r.pool, r.sink, "relay-crashes", "kafka", &polling.Hooks{AfterAck: func([]core.Envelope) error {
		return errors.New("crash between ACK and marker")
	}})
	select {
	case <-first.Stopped():
	case <-time.After(30 * time.Second):
		t.Fatal("the first relay did not crash")
	}
	startTestRelay(t, r.pool, r.sink, "relay-takes-over", "kafka")
	wait.ForStatus(t, 30*time.Second, "the successor to mark every row", func() (bool, string) {
		n := pgtest.Column[int64](t, r.pool, `SELECT count(*) FROM outbox_pending`)[0]
		return n == 0, fmt.Sprintf("%d rows unmarked", n)
	})
	var apiSpan trace.SpanContext
	for _, s := range exp.GetSpans() {
		if s.Name == "POST /v1/postings" {
			apiSpan = s.SpanContext
		}
	}
	publish := spansBy(exp, "publish ")
	recs := kafkatest.MustReadTopic(t, r.broker.addrs, core.TopicEvents, true)
	for _, e := range res.Events {
		pubs := publish[e.EventID]
		if len(pubs) != 1 || pubs[0].Parent.SpanID() != apiSpan.SpanID() {
			t.Fatalf("event %s: publish spans %v, want one, child of the API span %s", e.EventID, pubs, apiSpan.SpanID())
		}
		var carried []trace.SpanID
		for _, rec := range recs {
			if h := headers(rec); h[core.HeaderEventID] == e.EventID {
				carried = append(carried, spanOf(h).SpanID())
			}
		}
		if len(carried) != 1 || carried[0] != pubs[0].SpanContext.SpanID() {
			t.Errorf("event %s: committed records carry spans %v, want its publish span %s", e.EventID, carried, pubs[0].SpanContext.SpanID())
		}
	}
}

// TestOneTraceThroughCDC: the CDC relay reads the rows from the WAL with
// the same headers, so its publish spans are the API span's children and
// its records carry them.
func TestOneTraceThroughCDC(t *testing.T) {
	t.Parallel()
	tp, exp := tracingtest.Memory(t)
	mem := memory.New(memory.Config{})
	r := newTraceRigOn(t, cdcLedger(t), nil, mem, tp)
	rel, err := cdc.New(relaystore.New(r.pool), cdcsource.New(r.pool), r.sink, relay.Settings{
		Owner: "relay-cdc", SinkName: "memory", LeaseTTL: 2 * time.Second, Logger: relayQuietLog})
	if err != nil {
		t.Fatal(err)
	}
	relaytest.Start(t, rel)
	res := r.post(t)
	want := len(res.Events) + len(res.Commands)
	wait.ForStatus(t, 30*time.Second, "the CDC relay to publish the posting", func() (bool, string) {
		n, spans := len(mem.Records(core.TopicEvents)), len(spansBy(exp, "publish "))
		return n == len(res.Events) && spans == want, fmt.Sprintf("%d event records, %d publish spans", n, spans)
	})
	var apiSpan trace.SpanContext
	for _, s := range exp.GetSpans() {
		if s.Name == "POST /v1/postings" {
			apiSpan = s.SpanContext
		}
	}
	publish := spansBy(exp, "publish ")
	for _, m := range mem.Records(core.TopicEvents) {
		id := m.Metadata.Get(core.HeaderEventID)
		pubs := publish[id]
		if len(pubs) != 1 || pubs[0].Parent.SpanID() != apiSpan.SpanID() {
			t.Fatalf("event %s: publish spans %v, want one, child of the API span %s", id, pubs, apiSpan.SpanID())
		}
		if sc := spanOf(m.Metadata); sc.SpanID() != pubs[0].SpanContext.SpanID() {
			t.Errorf("record of %s carries span %s, want its publish span %s", id, sc.SpanID(), pubs[0].SpanContext.SpanID())
		}
	}
	if len(publish) != want {
		t.Errorf("publish spans for %d events and commands, want %d", len(publish), want)
	}
}

// TestTracingOffWritesNoTraceContext is the off case: the caller still
// sends a traceparent, but with tracing off the rows and the records carry
// no trace header, and no span is recorded, not even by a global tracer
// provider (Posthorn never falls back to otel's global one).
func TestTracingOffWritesNoTraceContext(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	global := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(global)
	t.Cleanup(func() {
		otel.SetTracerProvider(prev)
		_ = global.Shutdown(context.Background())
	})
	r := newTraceRig(t, nil, false)
	cons := r.startConsumer(t)
	res := r.post(t)
	events := []string{res.Events[0].EventID, res.Events[1].EventID}
	for id, h := range r.rowHeaders(t) {
		if _, ok := h[tracing.HeaderTraceparent]; ok {
			t.Errorf("row %s carries a traceparent with tracing off: %v", id, h)
		}
	}
	startTestRelay(t, r.pool, r.sink, "relay-off", "kafka")
	recs := r.broker.recordsHolding(events, 20*time.Second)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for _, rec := range recs {
		for _, kv := range rec.Headers {
			if kv.Key == tracing.HeaderTraceparent || kv.Key == tracing.HeaderTracestate {
				t.Errorf("record of %s carries %s with tracing off", headers(rec)[core.HeaderEventID], kv.Key)
			}
		}
	}
	wait.ForStatus(t, 30*time.Second, "the projection to apply both events", func() (bool, string) {
		n := counts(t, cons.pool, projection.Name).Events[core.DispositionApplied]
		return n == 2, fmt.Sprintf("applied %d", n)
	})
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Errorf("tracing off recorded %d spans, first %q", len(spans), spans[0].Name)
	}
}

// TestPublishContinuesTheCallersTrace: a team's service publishing with
// the publish package inside its own span: the row stores that span, and
// the relay's publish span is its child; without a span in the context the
// row carries no trace header.
func TestPublishContinuesTheCallersTrace(t *testing.T) {
	t.Parallel()
	tp, exp := tracingtest.Memory(t)
	_, pool := pgtest.Ledger(t)
	ctx, caller := tp.Tracer("wallets").Start(context.Background(), "credit wallet")
	var traced, plain publish.Published
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if traced, err = publish.Pgx(tx).Event(ctx, wallet("t-1", 0)); err != nil {
			return err
		}
		plain, err = publish.Pgx(tx).Event(context.Background(), wallet("t-2", 0))
		return err
	})
	caller.End()
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]map[string]string{}
	for _, id := range []string{traced.EventID, plain.EventID} {
		raw := pgtest.Column[[]byte](t, pool, `SELECT headers FROM outbox WHERE event_id = $1::uuid`, id)
		h := map[string]string{}
		if err := json.Unmarshal(raw[0], &h); err != nil {
			t.Fatal(err)
		}
		rows[id] = h
	}
	if got := spanOf(rows[traced.EventID]); got.SpanID() != caller.SpanContext().SpanID() {
		t.Fatalf("the row stores span %s, the caller's is %s", got.SpanID(), caller.SpanContext().SpanID())
	}
	if _, ok := rows[plain.EventID][tracing.HeaderTraceparent]; ok {
		t.Fatalf("a row published without a span carries a traceparent: %v", rows[plain.EventID])
	}
	sink := memory.New(memory.Config{})
	startTestRelay(t, pool, tracing.Sink(sink, tp, "memory"), "relay-publish-trace", "memory")
	wait.For(t, 10*time.Second, "both rows relayed", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	pubs := spansBy(exp, "publish ")[traced.EventID]
	if len(pubs) != 1 || pubs[0].Parent.SpanID() != caller.SpanContext().SpanID() || pubs[0].SpanContext.TraceID() != caller.SpanContext().TraceID() {
		t.Fatalf("publish spans of the traced event %+v, want one child of the caller's span %s", pubs, caller.SpanContext().SpanID())
	}
}
