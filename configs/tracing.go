package configs

import (
	"math"
	"net/url"
	"strings"
)

// Tracing configures OpenTelemetry tracing (adapters/tracing): one trace
// per posting, from the Posting API through the relay's publish to each
// consumer's apply. Off by default, and off writes no trace header.
type Tracing struct {
	// Exporter is off (the default) or otlp (OTLP/HTTP to Endpoint).
	Exporter string `koanf:"exporter"`
	// Endpoint is the OTLP/HTTP collector's base URL, http:// or https://
	// (e.g. http://127.0.0.1:4318); required with otlp. It must not carry
	// credentials: the exporter reads collector headers (an API key) from
	// the standard OTEL_EXPORTER_OTLP_HEADERS, which stays out of the
	// configuration and its printout.
	Endpoint string `koanf:"endpoint"`
	// ServiceName is the spans' service.name.
	ServiceName string `koanf:"service_name"`
	// SampleRatio is the share of new traces recorded, 0 to 1; a trace
	// continued from a caller's traceparent follows the caller's decision.
	SampleRatio float64 `koanf:"sample_ratio"`
}

func defaultTracing() Tracing {
	return Tracing{Exporter: "off", ServiceName: "posthorn", SampleRatio: 1}
}

// validate checks the keys; errors never echo the endpoint, which might
// hold what it must not.
func (t Tracing) validate() error {
	switch t.Exporter {
	case "off":
	case "otlp":
		if t.Endpoint == "" {
			return fieldErr("tracing.endpoint", "is required with tracing.exporter otlp (env POSTHORN_TRACING__ENDPOINT)")
		}
	default:
		return fieldErr("tracing.exporter", "is %q, want off or otlp", t.Exporter)
	}
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		switch {
		case err != nil:
			return fieldErr("tracing.endpoint", "is not a valid URL")
		case u.Scheme != "http" && u.Scheme != "https":
			return fieldErr("tracing.endpoint", "has scheme %q, want http:// or https://", u.Scheme)
		case u.Host == "":
			return fieldErr("tracing.endpoint", "has no host")
		case u.User != nil:
			return fieldErr("tracing.endpoint", "carries credentials; give them in OTEL_EXPORTER_OTLP_HEADERS instead")
		}
	}
	if strings.TrimSpace(t.ServiceName) == "" {
		return fieldErr("tracing.service_name", "is empty")
	}
	if math.IsNaN(t.SampleRatio) || t.SampleRatio < 0 || t.SampleRatio > 1 {
		return fieldErr("tracing.sample_ratio", "is %v, want a number from 0 to 1", t.SampleRatio)
	}
	return nil
}
