package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/adapters/kfakebroker"
	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/pgcluster"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/bridge"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/ops"
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
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted; the throwaway database and broker were removed: %w", err)
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
	ledger, consumer       *pgxpool.Pool
	mem                    *memory.Sink

	// apiURL and relayURL connect the API and the relay as their own
	// database roles (the throwaway cluster only; else the configured URL).
	apiURL, relayURL string

	relay     *bridge.Relay
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
	srv, err := api.New(api.Config{Tokens: d.cfg.API.Tokens, Logger: d.log, TracerProvider: d.tracer}, ledgerStore(d.cfg, apiPool))
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

	relayPool, err := connectRelayPool(ctx, d.relayURL)
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

	// Post, restarting the relay and the consumers at a third (soft stop,
	// new instances) and at two thirds (the relay cut short, as a crash
	// would) of the postings.
	bar := d.progressBar(postings, "posting")
	var (
		mu      sync.Mutex
		posted  int
		restart = make(chan string, 2)
	)
	loadDone := make(chan error, 1)
	go func() {
		var err error
		d.load, err = demo.Load(ctx, demo.LoadConfig{
			BaseURL:       "http://" + ln.Addr().String(),
			Token:         firstToken(d.cfg.API.Tokens),
			Postings:      postings,
			Workers:       d.workers,
			Accounts:      d.accounts,
			AccountPrefix: "acc-",
			KeyPrefix:     fmt.Sprintf("demo-%d-", d.started.UnixNano()),
			OnPosted: func(core.PostingResult) {
				mu.Lock()
				posted++
				n := posted
				mu.Unlock()
				if bar != nil {
					_ = bar.Add(1)
				}
				switch n {
				case max(1, postings/3):
					restart <- "soft"
				case max(2, 2*postings/3):
					restart <- "hard"
				}
			},
		})
		loadDone <- err
	}()
	for waiting := true; waiting; {
		select {
		case kind := <-restart:
			if err := d.restart(relayPool, kind == "hard"); err != nil {
				return sum, err
			}
		case err := <-d.consDone:
			return sum, fmt.Errorf("consumers stopped: %w", err)
		case err := <-loadDone:
			if err != nil {
				return sum, fmt.Errorf("posting through the API: %w", err)
			}
			waiting = false
		}
	}
	for len(restart) > 0 { // a tiny run may end before its restarts
		if err := d.restart(relayPool, <-restart == "hard"); err != nil {
			return sum, err
		}
	}
	if bar != nil {
		_ = bar.Finish()
	}

	if err := d.waitDelivered(ctx); err != nil {
		return sum, err
	}
	d.stopRelay(false)
	d.stopConsumers()
	d.report, err = demo.Verify(ctx, d.ledger, d.consumer, demo.VerifyOptions{})
	if err != nil {
		return sum, err
	}
	sum = demoSummary{
		Postings:             d.load.Postings,
		Events:               d.report.Events,
		Relayed:              d.report.Relayed,
		Applied:              d.report.MinApplied(),
		DuplicatesSuppressed: d.report.TotalDuplicates(),
		BalancesMatch:        d.report.BalancesMatch,
		Reconcile:            "clean",
		ElapsedS:             float64(time.Since(d.started).Round(100*time.Millisecond)) / float64(time.Second),
	}
	// Reconciliation by cut (what `posthorn reconcile` runs) over the same
	// databases: its verdict is the summary's "reconcile".
	var sources []ops.ConsumerSource
	for _, c := range demoConsumers {
		sources = append(sources, ops.ConsumerSource{Name: c, Reader: ops.InboxReader{Inbox: postgres.NewInbox(d.consumer), Consumer: c}})
	}
	d.reconcile, err = ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: postgres.NewOpsStore(d.ledger), Consumers: sources})
	if err != nil {
		return sum, fmt.Errorf("reconcile: %w", err)
	}
	if !d.reconcile.Clean {
		sum.Reconcile = "discrepancies"
	}
	if d.console {
		// The summary now, then the console stays up over the databases
		// the run used, until Ctrl-C removes them.
		if err := d.printResult(sum); err != nil {
			return sum, err
		}
		fmt.Fprintln(os.Stderr, "the operator console stays up; Ctrl-C stops it and removes the demo's databases")
		<-ctx.Done()
	}
	return sum, nil
}

// printResult prints the summary: one JSON object with --json, else for a
// person.
func (d *demoRun) printResult(sum demoSummary) error {
	if d.json {
		return json.NewEncoder(os.Stdout).Encode(sum)
	}
	d.printSummary(os.Stdout, sum)
	return nil
}

// startConsole serves the operator console (--console) over the demo's
// databases and sink until stop is called.
func (d *demoRun) startConsole(ctx context.Context) (stop func(), err error) {
	cfg := d.cfg
	cfg.Database.URL, cfg.Consumer.Database.URL = d.ledgerURL, d.consumerURL
	var sink core.Sink
	if d.mem != nil {
		sink = decorateSink(keepOpen{d.mem}, d.cfg.Sink, d.tracer)
	} else if sink, err = openSink(cfg.Sink, d.tracer); err != nil {
		return nil, err
	}
	// A pool of its own: the demo's checks keep theirs.
	pool, err := postgres.Connect(ctx, d.ledgerURL, 4)
	if err != nil {
		sink.Close()
		return nil, err
	}
	c, closeConsole, err := openConsole(ctx, cfg, pool, sink, nil, d.log)
	if err != nil {
		pool.Close()
		sink.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Console.Listen)
	if err != nil {
		closeConsole()
		pool.Close()
		sink.Close()
		return nil, fmt.Errorf("config key console.listen: %w", err)
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- c.Serve(cctx, ln) }()
	// On stderr whatever the log level: the demo logs at warn by default.
	fmt.Fprintf(os.Stderr, "operator console: http://%s/ (read-only unless console.token is set)\n", ln.Addr())
	return func() {
		cancel()
		if err := <-done; err != nil {
			d.log.Warn("operator console", "err", err)
		}
		closeConsole()
		pool.Close()
		sink.Close()
	}, nil
}

// clean reports whether the demo's checks and reconciliation found nothing.
func (d *demoRun) clean() bool { return d.report.Clean() && d.reconcile.Clean }

// databases sets up the ledger and consumer databases: the configured ones,
// or a throwaway cluster with one database of each. cleanup is always
// safe to call and removes the cluster.
func (d *demoRun) databases(ctx context.Context) (cleanup func(), err error) {
	var cluster *pgcluster.Cluster
	cleanup = func() {
		if d.ledger != nil {
			d.ledger.Close()
		}
		if d.consumer != nil {
			d.consumer.Close()
		}
		if cluster != nil {
			if err := cluster.Stop(); err != nil {
				d.log.Warn("removing the throwaway PostgreSQL cluster", "err", err)
			}
		}
	}
	d.ledgerURL, d.consumerURL = d.cfg.Database.URL, d.cfg.Consumer.Database.URL
	switch {
	case d.ledgerURL == "":
		if d.consumerURL != "" {
			return cleanup, errors.New("config key database.url: set it too when consumer.database.url is set, or unset both for a throwaway PostgreSQL")
		}
		if !d.json {
			fmt.Fprintln(os.Stderr, "starting a throwaway PostgreSQL (database.url is unset)…")
		}
		cluster, err = pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return cleanup, fmt.Errorf("database.url is unset, so the demo starts a throwaway PostgreSQL: %w", err)
		}
		d.log.Info("throwaway PostgreSQL started", "dir", cluster.Dir(), "port", cluster.Port())
		admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
		if err != nil {
			return cleanup, fmt.Errorf("throwaway PostgreSQL: %w", err)
		}
		for _, db := range []string{"posthorn_ledger", "posthorn_consumer"} {
			if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
				admin.Close(ctx)
				return cleanup, fmt.Errorf("throwaway PostgreSQL: create %s: %w", db, err)
			}
		}
		admin.Close(ctx)
		d.ledgerURL, d.consumerURL = cluster.URL("posthorn_ledger"), cluster.URL("posthorn_consumer")
	case d.consumerURL == "":
		return cleanup, errors.New("config key consumer.database.url: required when database.url is set (the consumers' own database)")
	}
	if err := postgres.Migrate(ctx, d.ledgerURL, postgres.LedgerSchema); err != nil {
		return cleanup, fmt.Errorf("migrate the ledger schema: %w", err)
	}
	if err := postgres.Migrate(ctx, d.consumerURL, postgres.ConsumerSchema); err != nil {
		return cleanup, fmt.Errorf("migrate the consumer schema: %w", err)
	}
	if d.ledger, err = postgres.Connect(ctx, d.ledgerURL, 2); err != nil {
		return cleanup, err
	}
	if d.consumer, err = postgres.Connect(ctx, d.consumerURL, 2); err != nil {
		return cleanup, err
	}
	d.cfg.Database.URL, d.cfg.Consumer.Database.URL = d.ledgerURL, d.consumerURL
	d.apiURL, d.relayURL = d.ledgerURL, d.ledgerURL
	if cluster != nil {
		// The demo owns the cluster: the API, the relay and the consumers
		// run under their own least-privilege roles, as in production.
		if d.apiURL, d.relayURL, d.cfg.Consumer.Database.URL, err = postgres.ComponentLogins(ctx, d.ledgerURL, d.consumerURL, "posthorn_demo"); err != nil {
			return cleanup, fmt.Errorf("per-component roles: %w", err)
		}
	}
	return cleanup, nil
}

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
	r, err := bridge.New(postgres.NewRelayStore(pool), sink, bridge.Config{
		Owner:        fmt.Sprintf("demo-relay-%d", d.relayN),
		SinkName:     d.cfg.Sink.Kind,
		BatchSize:    d.cfg.Relay.BatchSize,
		PollInterval: d.cfg.Relay.PollInterval,
		LeaseTTL:     d.cfg.Relay.LeaseTTL,
		Logger:       slog.New(plannedCrash{Handler: d.log.Handler(), cut: cut}),
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

// waitDelivered polls until every event is relayed and applied by both
// consumers, or the timeout passes.
func (d *demoRun) waitDelivered(ctx context.Context) error {
	deadline := time.Now().Add(d.timeout)
	p, err := demo.ReadProgress(ctx, d.ledger, d.consumer, demoConsumers)
	if err != nil {
		return err
	}
	bar := d.progressBar(int(p.Events), "delivering")
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if bar != nil {
			_ = bar.Set64(p.Events - p.Lag())
		}
		if p.Delivered() {
			if bar != nil {
				_ = bar.Finish()
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not delivered within --timeout %s: %d events, %d unrelayed, applied %v", d.timeout, p.Events, p.Unrelayed, p.Applied)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-d.consDone:
			return fmt.Errorf("consumers stopped: %w", err)
		case <-tick.C:
		}
		if p, err = demo.ReadProgress(ctx, d.ledger, d.consumer, demoConsumers); err != nil {
			return err
		}
	}
}

// progressBar returns a bar on a terminal, nil otherwise (and with --json).
func (d *demoRun) progressBar(n int, what string) *progressbar.ProgressBar {
	if d.json || !isTerminal(os.Stdout) {
		return nil
	}
	return progressbar.NewOptions(n,
		progressbar.OptionSetWriter(os.Stdout),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("it"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stdout) }),
	)
}

func (d *demoRun) printSummary(w io.Writer, s demoSummary) {
	fmt.Fprintf(w, "\nPosthorn demo (%s sink) finished in %.1f s\n", d.cfg.Sink.Kind, s.ElapsedS)
	fmt.Fprintf(w, "  postings committed through the API   %d (%d retried requests)\n", s.Postings, d.load.Retries)
	fmt.Fprintf(w, "  events in the outbox                 %d\n", s.Events)
	fmt.Fprintf(w, "  relayed (ACKed, then marked)         %d\n", s.Relayed)
	for _, c := range demoConsumers {
		fmt.Fprintf(w, "  applied by %-25s %d (duplicates suppressed by the inbox: %d)\n", c, d.report.Applied[c], d.report.DuplicatesSuppressed[c])
	}
	for _, r := range d.restarts {
		fmt.Fprintf(w, "  mid-run: %s\n", r)
	}
	fmt.Fprintf(w, "  balances of %d accounts: projection equals ledger: %v\n", d.report.Accounts, s.BalancesMatch)
	fmt.Fprintf(w, "  reconciliation by cut at journal sequence %d: %s\n", d.reconcile.Cut.Sequence, s.Reconcile)
	if d.clean() {
		fmt.Fprintln(w, "  every event applied exactly once per consumer, in revision order per account: clean")
		return
	}
	fmt.Fprintln(w, "  DISCREPANCIES:")
	for _, v := range d.report.Violations {
		fmt.Fprintf(w, "    %s\n", v)
	}
	for _, c := range d.reconcile.Consumers {
		if !c.Clean {
			fmt.Fprintf(w, "    reconcile %s: %+v\n", c.Name, c.Discrepancies)
		}
	}
}

// keepOpen shares the demo's memory broker with successive relays: a
// stopped relay closes its sink, which must not close the broker.
type keepOpen struct{ core.Sink }

func (keepOpen) Close() error { return nil }

func firstToken(ts []string) string {
	if len(ts) == 0 {
		return ""
	}
	return ts[0]
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
