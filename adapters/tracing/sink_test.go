package tracing_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/tracing"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/tracingtest"
	"github.com/posthorn/posthorn/relay"
)

// scripted is an inner sink that keeps what it was given and answers err.
type scripted struct {
	got [][]core.Envelope
	err error
}

func (s *scripted) Publish(_ context.Context, batch []core.Envelope) error {
	s.got = append(s.got, batch)
	return s.err
}

func (s *scripted) Close() error { return nil }

// fenced is scripted with the exactly-once methods.
type fenced struct {
	scripted
	fencedShards []int
}

func (f *fenced) Fence(_ context.Context, shard int) ([]int64, error) {
	f.fencedShards = append(f.fencedShards, shard)
	return []int64{7}, nil
}

func (f *fenced) PublishShard(ctx context.Context, _ int, batch []core.Envelope, _ []int64) error {
	return f.Publish(ctx, batch)
}

func (f *fenced) Unfence(int) {}

// rowContext is the trace context the Posting API's span leaves in a row.
func rowContext(t *testing.T, tp trace.TracerProvider) (trace.SpanContext, map[string]string) {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /v1/postings")
	span.End()
	h := map[string]string{"meta_reference": "inv-1"}
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(h))
	return span.SpanContext(), h
}

func envelope(id string, headers map[string]string) core.Envelope {
	return core.Envelope{EventID: id, Kind: core.KindEvent, Type: core.TypeAccountPosted, Topic: core.TopicEvents,
		AggregateType: core.AggregateAccount, AggregateID: "acc-" + id, Revision: 1, Headers: headers}
}

func TestSinkOffIsTheInnerSink(t *testing.T) {
	inner := &scripted{}
	if got := tracing.Sink(inner, nil, "memory"); got != core.Sink(inner) {
		t.Fatalf("tracing off wraps the sink: %T", got)
	}
}

// The publish span is a child of the row's span, the record carries the
// publish span (not the row's), the other headers pass, and the caller's
// batch is left as it was.
func TestSinkPublishSpanContinuesTheRow(t *testing.T) {
	tp, exp := tracingtest.Memory(t)
	api, headers := rowContext(t, tp)
	rowTraceparent := headers[tracing.HeaderTraceparent]
	inner := &scripted{}
	sink := tracing.Sink(inner, tp, "memory")
	if _, ok := sink.(relay.FencedSink); ok {
		t.Fatal("a plain sink became a FencedSink")
	}
	batch := []core.Envelope{envelope("a", headers), envelope("b", nil)}
	if err := sink.Publish(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	if batch[0].Headers[tracing.HeaderTraceparent] != rowTraceparent || batch[1].Headers != nil {
		t.Fatalf("the caller's batch was changed: %v, %v", batch[0].Headers, batch[1].Headers)
	}
	spans := publishSpans(exp)
	if len(spans) != 2 {
		t.Fatalf("%d publish spans, want 2", len(spans))
	}
	first, second := spans["a"], spans["b"]
	if first.Parent.SpanID() != api.SpanID() || first.SpanContext.TraceID() != api.TraceID() {
		t.Errorf("publish span of a has parent %s in trace %s, want the row's span %s in %s",
			first.Parent.SpanID(), first.SpanContext.TraceID(), api.SpanID(), api.TraceID())
	}
	if second.Parent.IsValid() || second.SpanContext.TraceID() == api.TraceID() {
		t.Errorf("a row without trace context continued a trace: parent %v", second.Parent)
	}
	if first.SpanKind != trace.SpanKindProducer || first.Name != "publish "+core.TopicEvents {
		t.Errorf("span %q kind %v", first.Name, first.SpanKind)
	}
	sent := inner.got[0]
	for i, name := range []string{"a", "b"} {
		got := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(sent[i].Headers))
		if sc := trace.SpanContextFromContext(got); sc.SpanID() != spans[name].SpanContext.SpanID() {
			t.Errorf("record %s carries span %s, want its publish span %s", name, sc.SpanID(), spans[name].SpanContext.SpanID())
		}
	}
	if sent[0].Headers["meta_reference"] != "inv-1" {
		t.Errorf("other headers lost: %v", sent[0].Headers)
	}
}

// A failed record's span has an error status; an ACKed one's has not.
func TestSinkSpanStatusFollowsTheRecord(t *testing.T) {
	tp, exp := tracingtest.Memory(t)
	inner := &scripted{err: &core.BatchError{Failed: map[int]error{1: errors.New("broker said no")}}}
	sink := tracing.Sink(inner, tp, "memory")
	if err := sink.Publish(context.Background(), []core.Envelope{envelope("a", nil), envelope("b", nil)}); err == nil {
		t.Fatal("the inner sink's error was lost")
	}
	spans := publishSpans(exp)
	if spans["a"].Status.Code == codes.Error || spans["b"].Status.Code != codes.Error {
		t.Fatalf("statuses a=%v b=%v, want only b failed", spans["a"].Status, spans["b"].Status)
	}
	exp.Reset()
	inner.err = errors.New("connection refused")
	_ = sink.Publish(context.Background(), []core.Envelope{envelope("c", nil)})
	if spans := publishSpans(exp); spans["c"].Status.Code != codes.Error {
		t.Fatalf("a whole-batch failure left status %v", spans["c"].Status)
	}
}

// Over a FencedSink the decorator is one too (the relay's exactly-once mode
// type-asserts it), and PublishShard is traced.
func TestSinkKeepsTheFencedSink(t *testing.T) {
	tp, exp := tracingtest.Memory(t)
	inner := &fenced{}
	fs, ok := tracing.Sink(inner, tp, "kafka").(relay.FencedSink)
	if !ok {
		t.Fatal("the decorator hid the FencedSink")
	}
	if ids, err := fs.Fence(context.Background(), 3); err != nil || len(ids) != 1 || len(inner.fencedShards) != 1 {
		t.Fatalf("Fence not passed through: %v %v %v", ids, err, inner.fencedShards)
	}
	if err := fs.PublishShard(context.Background(), 3, []core.Envelope{envelope("a", nil)}, []int64{1}); err != nil {
		t.Fatal(err)
	}
	if _, ok := publishSpans(exp)["a"]; !ok || inner.got[0][0].Headers[tracing.HeaderTraceparent] == "" {
		t.Fatal("PublishShard was not traced")
	}
}

// publishSpans returns the ended publish spans by event ID.
func publishSpans(exp *tracetest.InMemoryExporter) map[string]tracetest.SpanStub {
	out := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" {
				out[a.Value.AsString()] = s
			}
		}
	}
	return out
}

// Tracer providers are shut down by each test's cleanup: no exporter
// goroutine may outlive it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
