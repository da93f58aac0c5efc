package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay/polling"
)

// demoSummary is the --json object of contract.md's Demo section. Fields
// are added, never renamed.
type demoSummary struct {
	Postings             int     `json:"postings"`
	Events               int64   `json:"events"`
	Relayed              int64   `json:"relayed"`
	Applied              int64   `json:"applied"`
	DuplicatesSuppressed int64   `json:"duplicates_suppressed"`
	BalancesMatch        bool    `json:"balances_match"`
	Reconcile            string  `json:"reconcile"`
	ElapsedS             float64 `json:"elapsed_s"`
}

// demoConsumers are the example consumers the demo runs and checks.
var demoConsumers = []string{projection.Name, auditlog.Name}

func runDemo(ctx context.Context, args []string) error {
	fs := newFlags("demo", "database.url", "consumer.database.url", "log.level", "sink.kind")
	postings := fs.Int("postings", 3000, "number of random balanced transfers to post")
	asJSON := fs.Bool("json", false, "print one JSON object on stdout (logs at warn and above only, no progress bar)")
	workers := fs.Int("workers", demo.DefaultWorkers, "concurrent API clients")
	accounts := fs.Int("accounts", demo.DefaultAccounts, "number of accounts the transfers move money between")
	timeout := fs.Duration("timeout", 3*time.Minute, "how long to wait for delivery after the last posting")
	withConsole := fs.Bool("console", false, "serve the operator console on console.listen during the run and keep it up after it, until Ctrl-C")
	sinkKind := fs.String("sink", "", "sink kind (default kafka: an in-process Kafka-protocol broker; memory: the in-process memory broker; others from configuration, on a broker without earlier runs' events)")
	p, err := fs.start(ctx, args, needs{check: func(cfg *configs.Config) error {
		if *postings < 1 {
			return fmt.Errorf("--postings is %d, want at least 1", *postings)
		}
		if *workers < 1 || *accounts < 4 {
			return fmt.Errorf("--workers must be at least 1 and --accounts at least 4 (got %d and %d)", *workers, *accounts)
		}
		if *sinkKind != "" {
			cfg.Sink.Kind = *sinkKind
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("--sink: %w", err)
			}
		}
		// The demo's human output is the progress bar and the summary; logs
		// are at warn unless asked for, and never below warn with --json.
		if !fs.Changed("log.level") && os.Getenv(configs.EnvPrefix+"LOG__LEVEL") == "" {
			cfg.Log.Level = "warn"
		}
		if *asJSON {
			var lvl slog.Level
			_ = lvl.UnmarshalText([]byte(cfg.Log.Level))
			if lvl < slog.LevelWarn {
				cfg.Log.Level = "warn"
			}
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close() // flushes the spans
	cfg, log := p.cfg, p.log
	d := &demoRun{cfg: cfg, log: log, tracer: p.tracer, json: *asJSON, workers: *workers, accounts: *accounts, timeout: *timeout, console: *withConsole}
	sum, err := d.run(ctx, *postings)
	if err != nil {
		if ctx.Err() != nil && d.throwaway {
			return fmt.Errorf("interrupted; the throwaway database and broker were removed: %w", err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted; the configured databases keep what the demo wrote: %w", err)
		}
		return err
	}
	if !d.console { // with --console, run printed it before keeping the console up
		if err := d.printResult(sum); err != nil {
			return err
		}
	}
	if !d.clean() {
		if d.report.Has(demo.CheckUnknown) && d.cfg.Sink.Kind != "kafka" && d.cfg.Sink.Kind != "memory" {
			// The in-process brokers start empty; an external one keeps
			// what earlier runs published on the same topic.
			fmt.Fprintf(os.Stderr, "hint: the %s broker holds events this run's ledger never wrote, most likely from an earlier demo run; use a fresh stream/topic\n", d.cfg.Sink.Kind)
		}
		return &exitError{code: 1, err: errors.New("the demo's checks or reconciliation found discrepancies (see above)")}
	}
	return nil
}

// demoRun holds one demo's moving parts. The relay and the consumers are
// replaced mid-run, so they sit behind a mutex-free handoff: only run's
// goroutine starts and stops them.
type demoRun struct {
	cfg      configs.Config
	log      *slog.Logger
	tracer   trace.TracerProvider // nil: tracing off
	json     bool
	workers  int
	accounts int
	timeout  time.Duration
	console  bool // --console

	ledgerURL, consumerURL string
	// throwaway is set when the demo started its own PostgreSQL, which it
	// removes at the end; configured databases are left as they are.
	throwaway        bool
	ledger, consumer *pgxpool.Pool
	mem              *memory.Sink

	// apiURL and relayURL connect the API and the relay as their own
	// database roles (the throwaway cluster only; else the configured URL).
	apiURL, relayURL string

	relay     *polling.Relay
	relaySink core.Sink
	relayCut  *atomic.Bool // set when the demo cuts this relay short on purpose
	relayN    int
	consStop  context.CancelFunc
	consDone  chan error
	restarts  []string
	load      demo.LoadResult
	report    demo.Report
	reconcile ops.Report
	started   time.Time
}

// run is the demo, phase by phase: the databases (demo_setup.go), the
// broker, the console, the Posting API, the relay and the consumers; then
// post with the mid-run restarts (demo_load.go, demo_restart.go); wait
// until every event is delivered; last, check and reconcile
// (demo_report.go).
func (d *demoRun) run(ctx context.Context, postings int) (demoSummary, error) {
	d.started = time.Now()
	var sum demoSummary
	cleanup, err := d.databases(ctx)
	defer cleanup()
	if err != nil {
		return sum, err
	}

	switch d.cfg.Sink.Kind {
	case "kafka":
		b, err := kfakebroker.Start(kfakebroker.Options{Listen: "127.0.0.1:0", Log: d.log})
		if err != nil {
			return sum, fmt.Errorf("in-process Kafka-protocol broker: %w", err)
		}
		defer b.Close()
		d.cfg.Sink.Kafka.Brokers = b.Addrs()
		d.log.Info("in-process Kafka-protocol broker listening", "addr", b.Addrs()[0])
	case "memory":
		d.mem = memory.New(memory.Config{})
		defer d.mem.Close()
	}
	if d.console {
		stopConsole, err := d.startConsole(ctx)
		if err != nil {
			return sum, err
		}
		defer stopConsole()
	}

	// The Posting API on a free port, with authentication on as in
	// production: without api.tokens, a token made for this run that only
	// the demo's own clients know.
	if len(d.cfg.API.Tokens) == 0 {
		d.cfg.API.Tokens = []string{rand.Text()}
		d.log.Info("demo: api.tokens is empty, so the Posting API takes a bearer token generated for this run")
	}
	apiPool, err := postgres.Connect(ctx, d.apiURL, apiConns)
	if err != nil {
		return sum, err
	}
	defer apiPool.Close()
	srv, err := api.New(api.Config{Tokens: d.cfg.API.Tokens, Logger: d.log, TracerProvider: d.tracer}, ledgerStore(d.cfg, apiPool, nil))
	if err != nil {
		return sum, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return sum, fmt.Errorf("posting API listener: %w", err)
	}
	apiCtx, stopAPI := context.WithCancel(context.WithoutCancel(ctx))
	apiDone := make(chan error, 1)
	go func() { apiDone <- srv.Serve(apiCtx, ln) }()
	defer func() { stopAPI(); <-apiDone }()

	relayPool, err := connectRelayPool(ctx, d.relayURL, nil)
	if err != nil {
		return sum, err
	}
	defer relayPool.Close()
	if err := d.startRelay(relayPool); err != nil {
		return sum, err
	}
	defer d.stopRelay(false)
	d.startConsumers()
	defer d.stopConsumers()

	if err := d.post(ctx, relayPool, "http://"+ln.Addr().String(), postings); err != nil {
		return sum, err
	}

	if err := d.waitDelivered(ctx); err != nil {
		return sum, err
	}
	if sum, err = d.check(ctx); err != nil {
		return sum, err
	}
	if d.console {
		// The summary now, then the console stays up over the databases
		// the run used, until Ctrl-C removes them.
		if err := d.printResult(sum); err != nil {
			return sum, err
		}
		if d.throwaway {
			fmt.Fprintln(os.Stderr, "the operator console stays up; Ctrl-C stops it and removes the demo's databases")
		} else {
			fmt.Fprintln(os.Stderr, "the operator console stays up; Ctrl-C stops it")
		}
		<-ctx.Done()
	}
	return sum, nil
}

// clean reports whether the demo's checks and reconciliation found nothing.
func (d *demoRun) clean() bool { return d.report.Clean() && d.reconcile.Clean }
