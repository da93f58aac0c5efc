package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"

	"github.com/posthorn/posthorn/adapters/tracing"
	"github.com/posthorn/posthorn/configs"
)

// tracingFlushTimeout bounds the export of the spans still buffered when a
// command ends: a collector that does not answer delays the exit this much
// at most.
const tracingFlushTimeout = 5 * time.Second

// openTracing sets up tracing.* for the command (p.tracer stays nil when
// it is off) and registers the flush at close. The OTLP exporter's errors
// go to the command's log; its requests are not logged.
func (p *prelude) openTracing(ctx context.Context, command string) error {
	tp, shutdown, err := tracing.New(ctx, tracingConfig(p.cfg.Tracing), attribute.String("posthorn.command", command))
	if err != nil {
		return fmt.Errorf("config key tracing.exporter: %w", err)
	}
	if tp == nil {
		return nil
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { p.log.Warn("tracing: export failed", "err", err) }))
	p.tracer = tp
	p.log.Info("tracing on", "exporter", p.cfg.Tracing.Exporter, "endpoint", configs.RedactQuery(p.cfg.Tracing.Endpoint), "sample_ratio", p.cfg.Tracing.SampleRatio)
	p.closers = append(p.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			p.log.Warn("tracing: spans still buffered at exit were not exported", "err", err)
		}
	})
	return nil
}

func tracingConfig(c configs.Tracing) tracing.Config {
	return tracing.Config{Exporter: c.Exporter, Endpoint: c.Endpoint, ServiceName: c.ServiceName, SampleRatio: c.SampleRatio}
}
