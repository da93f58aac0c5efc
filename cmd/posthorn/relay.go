package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/metricshttp"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/bridge"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/subscribers"
	"github.com/posthorn/posthorn/core"
)

func init() {
	register(command{name: "relay", summary: "run the bridge: outbox → sink (SIGINT/SIGTERM stop it softly)", run: runRelay})
}

// sinkOpeners builds the sink of each sink.kind. Adding a kind is one entry
// here (and its name in configs.SinkKinds).
var sinkOpeners = map[string]func(configs.Sink) (core.Sink, error){
	"kafka": func(c configs.Sink) (core.Sink, error) {
		sec, err := subscribers.KafkaSecurity(c) // sink.kafka.{tls,sasl}
		if err != nil {
			return nil, err
		}
		return kafka.New(kafka.Config{Brokers: c.Kafka.Brokers, Partitioner: c.Kafka.Partitioner, Security: sec})
	},
	// An in-process broker: useful in the demo and tests, where consumers
	// share the process; a standalone relay with it only drains the outbox.
	"memory": func(configs.Sink) (core.Sink, error) { return memory.New(memory.Config{}), nil },
	// The broker sinks: subscribers builds them from the same settings as
	// the consumers' subscribers.
	"nats":     subscribers.OpenSink,
	"amqp":     subscribers.OpenSink,
	"redis":    subscribers.OpenSink,
	"postgres": subscribers.OpenSink,
}

// openSink returns the sink configured by sink.kind.
func openSink(c configs.Sink) (core.Sink, error) {
	open, ok := sinkOpeners[c.Kind]
	if !ok {
		return nil, fmt.Errorf("config key sink.kind: %q has no sink in this build", c.Kind)
	}
	return open(c)
}

func runRelay(ctx context.Context, args []string) error {
	fs, path := flagSet("relay")
	keyFlags(fs, "database.url", "metrics.listen", "sink.kind", "sink.kafka.brokers", "relay.owner")
	// Test-only: the fault suite's negative control (marker before ACK);
	// the flag exists only in a binary built with -tags posthorn_unsafe.
	unsafeMark := unsafeFlag(fs, "unsafe-mark-before-ack", "UNSAFE, tests only: write the marker before the broker ACK")
	cfg, err := loadConfig(fs, path, args)
	if err != nil {
		return err
	}
	if err := cfg.RequireDatabase(); err != nil {
		return err
	}
	if cfg.Relay.Mode == "cdc" {
		return runCDCRelay(ctx, cfg) // relay_cdc.go
	}
	log := newLogger(cfg.Log, os.Stderr)
	pool, err := connectRelayPool(ctx, cfg.Database.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	postgres.WarnIfSuperuser(ctx, pool, log, "relay", postgres.RoleRelay)
	sink, err := openSink(cfg.Sink)
	if err != nil {
		return err
	}
	defer sink.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	parkAttempts, parkAfter := cfg.Relay.RetryPark()
	relay, err := bridge.New(postgres.NewRelayStore(pool), sink, bridge.Config{
		ParkAfterAttempts: parkAttempts,
		ParkAfter:         parkAfter,
		Owner:             cfg.Relay.Owner,
		SinkName:          cfg.Sink.Kind,
		BatchSize:         cfg.Relay.BatchSize,
		PollInterval:      cfg.Relay.PollInterval,
		LeaseTTL:          cfg.Relay.LeaseTTL,
		Logger:            log,
		Registerer:        reg,
		Hooks:             unsafeRelayHooks(*unsafeMark, log),
	})
	if err != nil {
		return err
	}
	return serveRelay(ctx, cfg, log, reg, relay, []any{"owner", relay.Owner(), "sink", cfg.Sink.Kind},
		"finishing the in-flight batch, releasing leases", "unmarked")
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
// `posthorn relay` both modes share.
func serveRelay(ctx context.Context, cfg configs.Config, log *slog.Logger, reg *prometheus.Registry, relay runningRelay,
	started []any, stopping, resent string) error {
	if cfg.Metrics.Listen != "" {
		srv, err := metricshttp.Start(cfg.Metrics.Listen, reg, relay.Ready)
		if err != nil {
			return fmt.Errorf("config key metrics.listen: %w", err)
		}
		defer srv.Close()
		log.Info("metrics listening", "addr", srv.Addr())
	}
	// The relay stops softly when ctx (the signal context) is cancelled.
	if err := relay.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	log.Info("relay started", started...)
	select {
	case <-ctx.Done():
	case <-relay.Stopped():
		return errors.New("relay stopped unexpectedly")
	}
	log.Info("stopping relay: " + stopping)
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := relay.Stop(stopCtx); err != nil {
		log.Warn("relay stop cut short; "+resent+" records will be sent again", "err", err)
	}
	log.Info("relay stopped", slog.String("owner", relay.Owner()))
	return nil
}

// unsafeRelayHooks returns the hooks of --unsafe-mark-before-ack (nil
// without it), which only the fault suite's negative control sets.
func unsafeRelayHooks(markBeforeAck bool, log *slog.Logger) *bridge.Hooks {
	if !markBeforeAck {
		return nil
	}
	log.Warn("UNSAFE --unsafe-mark-before-ack: markers are written before the broker ACK, so a crash loses events; for negative-control tests only")
	return &bridge.Hooks{UnsafeMarkBeforeAck: true}
}
