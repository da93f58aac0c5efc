package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/term"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// cmdFlags is a subcommand's flag set: its own flags, the shared --config,
// and one flag per configuration key (--database.url, --relay.batch_size
// …, configs.AddKeyFlags), which override the file and the environment
// when they are set.
type cmdFlags struct {
	*pflag.FlagSet
	name   string
	config *string
}

// newFlags returns the flag set of the subcommand name with the --config
// flag and a flag per configuration key; the keys in shown, the ones the
// command mostly needs, are listed in its help, the rest are accepted
// without being listed.
func newFlags(name string, shown ...string) cmdFlags {
	fs := pflag.NewFlagSet("posthorn "+name, pflag.ContinueOnError)
	f := cmdFlags{FlagSet: fs, name: name, config: fs.String("config", "", "YAML configuration file")}
	configs.AddKeyFlags(fs, shown...)
	// Parse reports errors and prints the help itself.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return f
}

// Parse parses args. --help prints the command's help on stdout and
// returns pflag.ErrHelp (exit 0); any other error names the flag, with the
// key it probably meant for a misspelt key flag, and points at --help.
func (f cmdFlags) Parse(args []string) error {
	err := f.FlagSet.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pflag.ErrHelp):
		printCommandHelp(os.Stdout, f.name, f.FlagUsages())
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok && strings.Contains(name, ".") {
		if s := configs.Suggest(name); s != "" {
			msg += "; did you mean --" + s + "?"
		}
	}
	return fmt.Errorf("%s (see posthorn %s --help)", msg, f.name)
}

// needs is what a subcommand's prelude opens beyond the configuration and
// the logger, which every subcommand gets. Each pool, store or sink named
// here makes its configuration key required.
type needs struct {
	// check runs once the flags are parsed and the configuration is loaded,
	// before anything is opened: the command's own flag checks, and what its
	// flags change in the configuration (the demo's --sink).
	check func(*configs.Config) error
	// ledger is the size of the database.url pool; 0 opens none.
	ledger int32
	// relayLedger opens the database.url pool under the relay's
	// application name instead (connectRelayPool).
	relayLedger bool
	// history makes every ledger connection read the ledger's history
	// (p.history): the relay publishes and the API posts only on the
	// accepted one.
	history bool
	// consumer opens the consumer.database.url pool (openConsumerPool).
	consumer bool
	// archive opens archive.dir when it is set; requireArchive also
	// requires it.
	archive, requireArchive bool
	// sink opens the sink of sink.kind.
	sink bool
	// metrics creates a Prometheus registry with the Go and process
	// collectors.
	metrics bool
}

// prelude is what a subcommand works with once start returns: the
// configuration, the logger, and what its needs asked for (nil otherwise).
// close releases everything it opened, last opened first.
type prelude struct {
	cfg    configs.Config
	log    *slog.Logger
	ledger *pgxpool.Pool
	// history watches the ledger's history when needs.history is set.
	history  *postgres.HistoryWatch
	consumer *pgxpool.Pool
	archive  ops.ArchiveStore
	sink     core.Sink
	// sinkWatch explains sink's errors and knows the last publish's
	// outcome (sinkhealth.go).
	sinkWatch *sinkWatch
	reg       *prometheus.Registry
	// tracer is tracing.*'s provider, nil when tracing is off.
	tracer  trace.TracerProvider
	closers []func()
}

// start parses args, loads the configuration, runs n.check, checks the
// keys n requires, builds the logger and opens what n names, in that
// order, so a bad flag or key stops the command before it connects to
// anything. On an error, whatever was opened is closed again.
func (f cmdFlags) start(ctx context.Context, args []string, n needs) (*prelude, error) {
	if err := f.Parse(args); err != nil {
		return nil, err
	}
	cfg, err := configs.Load(*f.config, nil, f.FlagSet)
	if err != nil {
		return nil, err
	}
	if n.check != nil {
		if err := n.check(&cfg); err != nil {
			return nil, err
		}
	}
	p := &prelude{cfg: cfg, log: newLogger(cfg.Log, os.Stderr)}
	for _, key := range cfg.InsecureKeys() {
		p.log.Warn("config key "+key+" is true: the server's certificate is not verified, so anyone on the network path can read and alter this traffic; for tests only",
			"key", key)
	}
	// Tracing first, so that its flush, at close, comes last (tracing.go).
	if err := p.openTracing(ctx, f.Name()); err != nil {
		return nil, err
	}
	if err := p.open(ctx, n); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *prelude) open(ctx context.Context, n needs) error {
	if n.ledger > 0 || n.relayLedger {
		if err := p.cfg.RequireDatabase(); err != nil {
			return err
		}
	}
	if n.requireArchive {
		if err := p.cfg.RequireArchiveDir(); err != nil {
			return err
		}
	}
	if n.archive || n.requireArchive {
		st, err := openArchive(p.cfg)
		if err != nil {
			return err
		}
		p.archive = st
	}
	if n.history {
		p.history = postgres.NewHistoryWatch()
	}
	switch {
	case n.relayLedger:
		pool, err := connectRelayPool(ctx, p.cfg.Database.URL, p.history)
		if err != nil {
			return err
		}
		p.ledger = pool
		p.closers = append(p.closers, pool.Close)
		if err := requireSchema(ctx, pool, postgres.LedgerSchema); err != nil {
			return err
		}
	case n.ledger > 0:
		if err := p.openLedger(ctx, n.ledger); err != nil {
			return err
		}
	}
	if n.consumer {
		if err := p.openConsumer(ctx); err != nil {
			return err
		}
	}
	if n.metrics {
		p.reg = newRegistry()
	}
	if n.sink {
		sink, broker, err := openSinkOverBroker(p.cfg.Sink, p.tracer)
		if err != nil {
			return err
		}
		p.closers = append(p.closers, func() { _ = sink.Close() })
		if err := registerSinkMetrics(p.reg, broker); err != nil {
			return err
		}
		p.sinkWatch = newSinkWatch(p.cfg.Sink)
		p.sink = p.sinkWatch.wrap(sink)
	}
	return nil
}

// openLedger requires database.url, opens p.ledger with conns
// connections and checks the ledger schema's version (requireSchema).
func (p *prelude) openLedger(ctx context.Context, conns int32) error {
	if err := p.cfg.RequireDatabase(); err != nil {
		return err
	}
	pool, err := connectWatched(ctx, p.cfg.Database.URL, conns, p.history)
	if err != nil {
		return err
	}
	p.ledger = pool
	p.closers = append(p.closers, pool.Close)
	return requireSchema(ctx, pool, postgres.LedgerSchema)
}

// openConsumer requires consumer.database.url and opens p.consumer.
func (p *prelude) openConsumer(ctx context.Context) error {
	if err := p.cfg.RequireConsumerDatabase(); err != nil {
		return err
	}
	pool, err := openConsumerPool(ctx, p.cfg)
	if err != nil {
		return err
	}
	p.consumer = pool
	p.closers = append(p.closers, pool.Close)
	return nil
}

// requireSchema stops a command whose database lacks schema, or has it at
// an older version than this binary's, with the migrate command to run,
// before it fails later on a missing relation.
func requireSchema(ctx context.Context, pool *pgxpool.Pool, schema postgres.Schema) error {
	cmd, key := "posthorn migrate", "database.url"
	if schema == postgres.ConsumerSchema {
		cmd, key = "posthorn migrate --consumer", "consumer.database.url"
	}
	st, err := postgres.CheckSchema(ctx, pool, schema)
	switch {
	case err != nil:
		return fmt.Errorf("config key %s: %w", key, err)
	case st.Missing:
		return fmt.Errorf("the %s schema is missing from the database of %s: run `%s` first", schema, key, cmd)
	case len(st.Pending) > 0:
		return fmt.Errorf("the %s schema of %s is older than this posthorn%s: run `%s` first", schema, key, pendingList(st), cmd)
	}
	return nil
}

// pendingList is ": N migration(s) pending (a, b)" for a status with
// pending migrations, and empty otherwise.
func pendingList(st postgres.SchemaStatus) string {
	if len(st.Pending) == 0 {
		return ""
	}
	return fmt.Sprintf(": %d migration(s) pending (%s)", len(st.Pending), strings.Join(st.Pending, ", "))
}

// close releases what start opened.
func (p *prelude) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
	p.closers = nil
}

// newRegistry is the metrics registry of a long-running command: its own
// metrics beside the Go runtime's and the process's.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// newLogger returns the structured logger the configuration asks for. With
// log.format auto it writes text lines when w is a terminal, for a person,
// and JSON otherwise, for a log pipeline.
func newLogger(cfg configs.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Level))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "text" || cfg.Format == "auto" && isTerminal(w) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// isTerminal reports whether w is a terminal: progress bars and text logs
// for a person there, plain lines and JSON for anything else.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
