// Package tracingtest records spans in memory for tests: a tracer provider
// built as tracing.New builds one (tracing.NewProvider), exporting every
// span as it ends to an in-memory exporter the test reads.
package tracingtest

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/posthorn/posthorn/adapters/tracing"
)

// Memory returns a provider that records every span and its exporter; the
// provider is shut down when t ends.
func Memory(t testing.TB) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp, err := tracing.NewProvider(sdktrace.NewSimpleSpanProcessor(exp), tracing.Config{SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}
