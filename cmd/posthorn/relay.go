package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/adapters/metricshttp"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/adapters/tracing"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// openSink returns the sink configured by sink.* (brokers.go), decorated
// by decorateSink.
func openSink(c configs.Sink, tp trace.TracerProvider) (core.Sink, error) {
	s, _, err := openSinkOverBroker(c, tp)
	return s, err
}

// openSinkOverBroker is openSink that also returns the broker's sink under
// the decorations, whose own metrics registerSinkMetrics registers.
func openSinkOverBroker(c configs.Sink, tp trace.TracerProvider) (sink, broker core.Sink, err error) {
	broker, err = openBroker(c, brokers.OpenSink)
	if err != nil {
		return nil, nil, err
	}
	return decorateSink(broker, c, tp), broker, nil
}

// registerSinkMetrics registers the metrics a broker's sink collects
// itself (the Kafka sink in exactly-once mode:
// posthorn_relay_open_transaction_age_seconds); none without reg.
func registerSinkMetrics(reg prometheus.Registerer, broker core.Sink) error {
	if c, ok := broker.(prometheus.Collector); ok && reg != nil {
		return reg.Register(c)
	}
	return nil
}

// decorateSink lays s's records out in sink.format and gives each a
// publish span (tracing.*; none when tp is nil). The span sees the record
// as it goes out: its format's topic and headers.
func decorateSink(s core.Sink, c configs.Sink, tp trace.TracerProvider) core.Sink {
	return relay.Formatted(tracing.Sink(s, tp, c.Kind), c.WireFormat())
}

func runRelay(ctx context.Context, args []string) error {
	fs := newFlags("relay", "database.url", "metrics.listen", "sink.kind", "sink.kafka.brokers", "relay.owner")
	// Test-only: the fault suite's negative control (marker before ACK);
	// the flag exists only in a binary built with -tags posthorn_unsafe.
	unsafeMark := unsafeFlag(fs.FlagSet, "unsafe-mark-before-ack", "UNSAFE, tests only: write the marker before the broker ACK")
	// And the partition suite's exactly-once control: fence, but do not
	// mark what the shard's committed transactions hold.
	unsafeSkip := unsafeFlag(fs.FlagSet, "unsafe-skip-positions", "UNSAFE, tests only: with exactly-once, fence without marking what committed transactions hold")
	p, err := fs.start(ctx, args, needs{relayLedger: true, history: true, sink: true, metrics: true})
	if err != nil {
		return err
	}
	defer p.close()
	if *unsafeSkip {
		p.log.Warn("UNSAFE --unsafe-skip-positions: a shard's committed transactions are not marked after a fence, so they are sent again; for negative-control tests only")
	}
	if p.cfg.Relay.Mode == relay.ModeCDC {
		return runCDCRelay(ctx, p, *unsafeSkip) // relay_cdc.go
	}
	postgres.WarnIfSuperuser(ctx, p.ledger, p.log, "relay", postgres.RoleRelay)
	store := relaystore.New(p.ledger)
	settings := relaySettings(p, store)
	if err := relay.CheckStandbys(ctx, settings.StandbyFlush, p.log); err != nil {
		return fmt.Errorf("config key relay.standby_flush: %w", err)
	}
	r, err := polling.NewWithHooks(store, p.sink, settings, unsafeRelayHooks(*unsafeMark, *unsafeSkip, p.log))
	if err != nil {
		return err
	}
	return serveRelay(ctx, p, r, []any{"owner", r.Owner(), "sink", p.cfg.Sink.Kind},
		"finishing the in-flight batch, releasing leases", "unmarked")
}

// relaySettings returns relay.* as both modes take it, with what this
// process wires in: the sink's name and exactly-once mode, the standby
// probe, the ledger's history, the logger and the registry.
func relaySettings(p *prelude, probe relay.StandbyProbe) relay.Settings {
	s := p.cfg.Relay
	s.SinkName = p.cfg.Sink.Kind
	s.ExactlyOnce = p.cfg.Sink.Kind == "kafka" && p.cfg.Sink.Kafka.ExactlyOnce
	s.StandbyFlush.Probe = probe
	s.History = p.history
	s.Logger = p.log
	s.Registerer = p.reg
	return s
}

// runningRelay is what serveRelay needs of the polling and the CDC relay.
type runningRelay interface {
	Start(context.Context) error
	Stop(context.Context) error
	Stopped() <-chan struct{}
	Ready() error
	Owner() string
}

// serveRelay serves the relay's metrics, starts it, and on the signal
// (ctx) stops it softly, giving it 30 s to finish its batch: the part of
// `posthorn relay` both modes share. /readyz answers ready while the relay
// runs, the ledger answers and the sink is reachable and took its last
// publish.
func serveRelay(ctx context.Context, p *prelude, r runningRelay, started []any, stopping, resent string) error {
	log := p.log
	if p.cfg.Metrics.Listen != "" {
		srv, err := metricshttp.Start(p.cfg.Metrics.Listen, p.reg, func() error {
			if err := r.Ready(); err != nil {
				return err
			}
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := p.ledger.Ping(rctx); err != nil {
				return errors.New("ledger database unreachable (database.url)")
			}
			return p.sinkWatch.ready(rctx)
		})
		if err != nil {
			return fmt.Errorf("config key metrics.listen: %w", err)
		}
		defer srv.Close()
		log.Info("metrics listening", "addr", srv.Addr())
	}
	// The relay stops softly when ctx (the signal context) is cancelled.
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	log.Info("relay started", started...)
	select {
	case <-ctx.Done():
	case <-r.Stopped():
		return errors.New("relay stopped unexpectedly")
	}
	log.Info("stopping relay: " + stopping)
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The relay logs its own "stopped" line, with the shards it released.
	if err := r.Stop(stopCtx); err != nil {
		log.Warn("relay stop cut short; "+resent+" records will be sent again", "err", err)
	}
	return nil
}

// unsafeRelayHooks returns the hooks of --unsafe-mark-before-ack and
// --unsafe-skip-positions (nil without them), which only the fault suites'
// negative controls set.
func unsafeRelayHooks(markBeforeAck, skipPositions bool, log *slog.Logger) *polling.Hooks {
	if !markBeforeAck && !skipPositions {
		return nil
	}
	if markBeforeAck {
		log.Warn("UNSAFE --unsafe-mark-before-ack: markers are written before the broker ACK, so a crash loses events; for negative-control tests only")
	}
	return &polling.Hooks{UnsafeMarkBeforeAck: markBeforeAck, UnsafeSkipPositions: skipPositions}
}
