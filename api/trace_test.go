package api_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/core"
)

// spanStore answers every posting and keeps the span context the API
// handed it, which is what the ledger writes into the outbox rows.
type spanStore struct {
	api.Store
	got []trace.SpanContext
}

func (s *spanStore) Post(ctx context.Context, _ string, _ core.Posting) (core.PostingResult, bool, error) {
	s.got = append(s.got, trace.SpanContextFromContext(ctx))
	return core.PostingResult{JournalID: "0190a000-0000-7000-8000-000000000001"}, false, nil
}

func postWithTraceparent(t *testing.T, cfg api.Config, store api.Store, traceparent string) int {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv, err := api.New(cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/postings", strings.NewReader(validPosting))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "trace-1")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec.Code
}

const callerTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// A posting request continues the caller's trace in a server span, and the
// store receives that span (so the rows carry it).
func TestPostingSpanContinuesTheCaller(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	store := &spanStore{}
	if code := postWithTraceparent(t, api.Config{TracerProvider: tp}, store, callerTraceparent); code != http.StatusCreated {
		t.Fatalf("status %d", code)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Name != "POST /v1/postings" || s.SpanKind != trace.SpanKindServer {
		t.Errorf("span %q kind %v", s.Name, s.SpanKind)
	}
	if s.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("span in trace %s with parent %s: the caller's traceparent was not continued", s.SpanContext.TraceID(), s.Parent.SpanID())
	}
	if len(store.got) != 1 || store.got[0].SpanID() != s.SpanContext.SpanID() {
		t.Errorf("the store got span %v, want the request's %s", store.got, s.SpanContext.SpanID())
	}
	var journal string
	for _, a := range s.Attributes {
		if a.Key == "posthorn.journal_id" {
			journal = a.Value.AsString()
		}
	}
	if journal == "" {
		t.Errorf("no posthorn.journal_id on the span: %v", s.Attributes)
	}
}

// With tracing off the caller's traceparent is ignored: the store gets no
// span, so no row carries a trace header.
func TestPostingWithoutTracingHasNoSpan(t *testing.T) {
	store := &spanStore{}
	if code := postWithTraceparent(t, api.Config{}, store, callerTraceparent); code != http.StatusCreated {
		t.Fatalf("status %d", code)
	}
	if len(store.got) != 1 || store.got[0].IsValid() {
		t.Fatalf("the store got span context %v with tracing off", store.got)
	}
}
