package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/posthorn/posthorn/adapters/tracing"
)

// With otlp, the spans reach the collector's traces path below the
// configured base URL, at the latest when the provider is shut down (the
// commands' flush); off is no provider at all.
func TestNewExportsOverOTLPHTTP(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	var bodies int
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		if len(b) > 0 {
			bodies++
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	ctx := context.Background()
	tp, shutdown, err := tracing.New(ctx, tracing.Config{Exporter: tracing.ExporterOTLP, Endpoint: collector.URL + "/otlp", SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("test").Start(ctx, "POST /v1/postings")
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "POST /otlp/v1/traces application/x-protobuf" || bodies != 1 {
		t.Fatalf("collector got %v (%d with a body), want one POST /otlp/v1/traces of protobuf", paths, bodies)
	}

	for _, off := range []string{"", tracing.ExporterOff} {
		tp, shutdown, err := tracing.New(ctx, tracing.Config{Exporter: off})
		if err != nil || tp != nil || shutdown(ctx) != nil {
			t.Fatalf("exporter %q: provider %v, err %v; want none", off, tp, err)
		}
	}
}
