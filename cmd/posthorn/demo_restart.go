package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// startRelay starts a new relay instance with its own sink connection
// (the shared broker for sink.kind memory).
func (d *demoRun) startRelay(pool *pgxpool.Pool) error {
	var sink core.Sink
	if d.mem != nil {
		sink = decorateSink(keepOpen{d.mem}, d.cfg.Sink, d.tracer)
	} else {
		var err error
		if sink, err = openSink(d.cfg.Sink, d.tracer); err != nil {
			return err
		}
	}
	d.relayN++
	cut := new(atomic.Bool)
	r, err := polling.New(relaystore.New(pool), sink, relay.Settings{
		Owner:             fmt.Sprintf("demo-relay-%d", d.relayN),
		SinkName:          d.cfg.Sink.Kind,
		BatchSize:         d.cfg.Relay.BatchSize,
		PollInterval:      d.cfg.Relay.PollInterval,
		LeaseTTL:          d.cfg.Relay.LeaseTTL,
		ParkAfterAttempts: d.cfg.Relay.ParkAfterAttempts,
		ParkAfter:         d.cfg.Relay.ParkAfter,
		Logger:            slog.New(plannedCrash{Handler: d.log.Handler(), cut: cut}),
	})
	if err != nil {
		sink.Close()
		return err
	}
	if err := r.Start(context.Background()); err != nil {
		sink.Close()
		return err
	}
	d.relay, d.relaySink, d.relayCut = r, sink, cut
	return nil
}

// stopRelay stops the relay softly, or cuts it short (hard) as a crash
// would: its in-flight batch is not marked and will be sent again.
func (d *demoRun) stopRelay(hard bool) {
	if d.relay == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if hard {
		d.log.Info("demo: simulating a relay crash between ACK and marker: cutting "+d.relay.Owner()+" short",
			"consequence", "its in-flight batch is sent again without a marker, and the consumers' inbox absorbs the repeats")
		d.relayCut.Store(true)
		cancel()
	}
	if err := d.relay.Stop(ctx); err != nil && !hard {
		d.log.Warn("relay stop cut short", "err", err)
	}
	cancel()
	d.relaySink.Close()
	d.relay, d.relaySink, d.relayCut = nil, nil, nil
}

// startConsumers runs both example consumers as `posthorn consume` does.
func (d *demoRun) startConsumers() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts := consumeOptions{log: d.log, tracer: d.tracer}
	if d.mem != nil {
		opts.memory = d.mem.Subscriber()
	}
	go func() { done <- runConsumers(ctx, d.cfg, opts) }()
	d.consStop, d.consDone = cancel, done
}

func (d *demoRun) stopConsumers() {
	if d.consStop == nil {
		return
	}
	d.consStop()
	// A consumer stopped while it was still connecting reports the
	// cancellation; that is the stop we asked for.
	if err := <-d.consDone; err != nil && !errors.Is(err, context.Canceled) {
		d.log.Warn("consumers stopped with an error", "err", err)
	}
	d.consStop, d.consDone = nil, nil
}

func (d *demoRun) restart(pool *pgxpool.Pool, hard bool) error {
	what := "relay and consumers stopped softly and restarted"
	if hard {
		what = "relay cut short (as by a crash) and restarted; consumers restarted"
	} else {
		d.log.Info("demo: planned restart: stopping the relay and the consumers softly, then starting new ones")
	}
	d.stopRelay(hard)
	d.stopConsumers()
	d.restarts = append(d.restarts, what)
	if err := d.startRelay(pool); err != nil {
		return err
	}
	d.startConsumers()
	d.log.Info("demo: " + what)
	return nil
}

// plannedCrash is the log handler of one demo relay. Once the demo cuts
// that relay short on purpose (its simulated crash), the cancellation errors
// the cut causes, such as the marker write it interrupts, are the planned
// fault's consequences: they are logged at INFO and say so. Every other
// record keeps its level, so a real failure during the demo still logs as
// one.
type plannedCrash struct {
	slog.Handler
	cut *atomic.Bool
}

func (h plannedCrash) Handle(ctx context.Context, r slog.Record) error {
	if r.Level <= slog.LevelInfo || !h.cut.Load() || !cancelled(r) {
		return h.Handler.Handle(ctx, r)
	}
	if !h.Handler.Enabled(ctx, slog.LevelInfo) {
		return nil
	}
	planned := slog.NewRecord(r.Time, slog.LevelInfo, "demo: expected after the simulated crash: "+r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool { planned.AddAttrs(a); return true })
	return h.Handler.Handle(ctx, planned)
}

func (h plannedCrash) WithAttrs(as []slog.Attr) slog.Handler {
	return plannedCrash{Handler: h.Handler.WithAttrs(as), cut: h.cut}
}

func (h plannedCrash) WithGroup(name string) slog.Handler {
	return plannedCrash{Handler: h.Handler.WithGroup(name), cut: h.cut}
}

// cancelled reports whether r carries an error caused by a cancelled
// context.
func cancelled(r slog.Record) (yes bool) {
	r.Attrs(func(a slog.Attr) bool {
		err, ok := a.Value.Any().(error)
		yes = ok && errors.Is(err, context.Canceled)
		return !yes
	})
	return yes
}
