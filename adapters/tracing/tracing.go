// Package tracing is Posthorn's OpenTelemetry adapter: the tracer provider
// the configuration asks for (OTLP over HTTP, or off), and the sink
// decorator that gives every published envelope a span (sink.go).
//
// One posting is one trace. The Posting API starts or continues a span per
// request; the ledger stores its W3C trace context (traceparent,
// tracestate) in the headers of every outbox row of the posting; the sink
// decorator starts a publish span per envelope whose parent is the row's
// context and puts the publish span's context on the record; the consumer
// middleware continues it in an apply span around the inbox transaction.
//
// Invariants:
//   - Off is nothing: New returns a nil trace.TracerProvider, and every
//     package that takes one (api, consumers, Sink) treats nil as no span
//     and no header, so rows and records stay byte for byte as without
//     tracing.
//   - The trace context travels only as W3C Trace Context headers
//     (Propagator), in the row's headers and the record's headers; it never
//     replaces a contract header.
//   - A resend, a replay or a publish after a relay crash reads the same
//     row, so its publish span is a new span in the posting's trace.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Exporters of Config.Exporter.
const (
	// ExporterOff records no span and writes no trace header.
	ExporterOff = "off"
	// ExporterOTLP exports spans over OTLP/HTTP (protobuf) to Endpoint.
	ExporterOTLP = "otlp"
)

// DefaultServiceName is the service.name of Posthorn's spans.
const DefaultServiceName = "posthorn"

// ScopeName is the instrumentation scope of every Posthorn span.
const ScopeName = "github.com/posthorn/posthorn"

// Propagator is the one format of the trace context in rows and records:
// W3C traceparent and tracestate.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Header names of the trace context (W3C Trace Context).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Config selects the exporter; configs.Tracing validates it.
type Config struct {
	// Exporter is ExporterOff (the zero value counts as off) or ExporterOTLP.
	Exporter string
	// Endpoint is the OTLP/HTTP collector's base URL, http:// or https://
	// (e.g. http://127.0.0.1:4318); the exporter posts to /v1/traces
	// below it. Required with ExporterOTLP.
	Endpoint string
	// ServiceName is the service.name resource attribute; default
	// DefaultServiceName.
	ServiceName string
	// SampleRatio is the share of new traces recorded, 0..1; a continued
	// trace follows its parent's decision.
	SampleRatio float64
}

// New returns the tracer provider cfg asks for and the function that
// flushes and stops it; with tracing off, a nil provider and a no-op.
// attrs are added to the resource (e.g. the subcommand). New does not
// connect: an unreachable collector shows as export errors later, never as
// a failed command.
func New(ctx context.Context, cfg Config, attrs ...attribute.KeyValue) (trace.TracerProvider, func(context.Context) error, error) {
	switch cfg.Exporter {
	case "", ExporterOff:
		return nil, func(context.Context) error { return nil }, nil
	case ExporterOTLP:
	default:
		return nil, nil, fmt.Errorf("tracing: unknown exporter %q", cfg.Exporter)
	}
	if cfg.Endpoint == "" {
		return nil, nil, errors.New("tracing: the OTLP exporter needs an endpoint")
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, errors.New("tracing: the OTLP endpoint must be an http:// or https:// URL")
	}
	// The endpoint is a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is: the
	// signal's path goes below it (WithEndpointURL would post to the bare
	// URL instead).
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path.Join("/", u.Path, "v1/traces"))}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	tp, err := NewProvider(sdktrace.NewBatchSpanProcessor(exp), cfg, attrs...)
	if err != nil {
		return nil, nil, err
	}
	return tp, tp.Shutdown, nil
}

// NewProvider returns an SDK tracer provider over processor with cfg's
// service name and sampler: what New builds around the OTLP exporter, and
// what tests build around an in-memory one.
func NewProvider(processor sdktrace.SpanProcessor, cfg Config, attrs ...attribute.KeyValue) (*sdktrace.TracerProvider, error) {
	name := cfg.ServiceName
	if name == "" {
		name = DefaultServiceName
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(append([]attribute.KeyValue{attribute.String("service.name", name)}, attrs...)...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(processor),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	), nil
}
