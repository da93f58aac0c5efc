package configs

import (
	"strings"
	"testing"
)

func TestTracingKeys(t *testing.T) {
	cfg, err := Load("", []string{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tracing != (Tracing{Exporter: "off", ServiceName: "posthorn", SampleRatio: 1}) {
		t.Fatalf("defaults: %+v", cfg.Tracing)
	}
	cfg, err = Load("", []string{"POSTHORN_TRACING__EXPORTER=otlp", "POSTHORN_TRACING__ENDPOINT=https://collector:4318",
		"POSTHORN_TRACING__SERVICE_NAME=ledger-eu", "POSTHORN_TRACING__SAMPLE_RATIO=0.25"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tracing != (Tracing{Exporter: "otlp", Endpoint: "https://collector:4318", ServiceName: "ledger-eu", SampleRatio: 0.25}) {
		t.Fatalf("env not applied: %+v", cfg.Tracing)
	}
}

func TestBadTracingValuesNameTheKey(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		key  string
	}{
		{"unknown exporter", []string{"POSTHORN_TRACING__EXPORTER=jaeger"}, "tracing.exporter"},
		{"otlp without endpoint", []string{"POSTHORN_TRACING__EXPORTER=otlp"}, "tracing.endpoint"},
		{"endpoint without scheme", []string{"POSTHORN_TRACING__EXPORTER=otlp", "POSTHORN_TRACING__ENDPOINT=collector:4318"}, "tracing.endpoint"},
		{"grpc scheme", []string{"POSTHORN_TRACING__EXPORTER=otlp", "POSTHORN_TRACING__ENDPOINT=grpc://collector:4317"}, "tracing.endpoint"},
		{"endpoint without host", []string{"POSTHORN_TRACING__EXPORTER=otlp", "POSTHORN_TRACING__ENDPOINT=http:///v1/traces"}, "tracing.endpoint"},
		{"credentials in endpoint", []string{"POSTHORN_TRACING__EXPORTER=otlp", "POSTHORN_TRACING__ENDPOINT=https://u:hunter2hunter2@collector:4318"}, "tracing.endpoint"},
		{"empty service name", []string{"POSTHORN_TRACING__SERVICE_NAME= "}, "tracing.service_name"},
		{"ratio above 1", []string{"POSTHORN_TRACING__SAMPLE_RATIO=1.5"}, "tracing.sample_ratio"},
		{"negative ratio", []string{"POSTHORN_TRACING__SAMPLE_RATIO=-0.1"}, "tracing.sample_ratio"},
		{"ratio not a number", []string{"POSTHORN_TRACING__SAMPLE_RATIO=all"}, "tracing.sample_ratio"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("", tc.env, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %q does not name %s", err, tc.key)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error %q echoes the endpoint's password", err)
			}
		})
	}
}
