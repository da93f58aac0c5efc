// Package console is the operator console: one server-rendered page that
// shows the data path moving (API → outbox → relay → sink → each consumer),
// plots of the last hour from samples it keeps itself, the parked
// aggregates on both sides, the last reconciliation and the cleanup
// boundary, and the CDC slot; and, behind a token and a confirmation, the
// actions the CLI has: release a parked aggregate (relay or consumer side),
// resend by event ID, reconcile.
//
// Invariants: every action calls the same code as its CLI command
// (Store's releases, ops.Resend, ops.Reconcile); every action that passes
// its checks is written to the audit log before it runs; a refused request
// (CSRF token, action token, input) changes nothing and names the field.
// With Config.Operators the audit log names the operator whose token was
// presented, not a name the caller typed. A refused token is logged
// (address and action, never the token) and an address that fails
// Config.MaxTokenFailures times within a minute gets 429 for a minute
// (internal/authguard). Every answer refuses framing (X-Frame-Options and
// CSP frame-ancestors), and the server bounds how long a request may take
// to arrive (ReadTimeout).
// The page works without JavaScript; only the plots need it. Everything it
// serves is embedded in the binary (html/template, embed, uPlot).
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/authguard"
	"github.com/posthorn/posthorn/ops"
)

// Defaults of Config.
const (
	// DefaultSampleEvery is how often the plots' counters are read.
	DefaultSampleEvery = 2 * time.Second
	// DefaultWindow is how far back the plots reach.
	DefaultWindow = time.Hour
	// DefaultBoundaryEvery bounds how often the cleanup boundary (a dry
	// run that re-verifies archive segments) is computed.
	DefaultBoundaryEvery = 15 * time.Second
	// DefaultReadTimeout bounds reading a whole request, headers and body:
	// a client trickling its request is cut off then.
	DefaultReadTimeout = 15 * time.Second
	// readHeaderTimeout bounds reading the headers, within ReadTimeout.
	readHeaderTimeout = 10 * time.Second
)

// Config configures the console. Store and Ledger are required.
type Config struct {
	Store Store
	// Ledger is the ops store: recorded coverage, the cleanup dry run,
	// resend and reconcile.
	Ledger ops.Store
	// Consumers are the consumers reconcile reads (read-only), in the
	// order the page shows them.
	Consumers []ops.ConsumerSource
	// Archive is archive.dir's store (nil when unset): reconcile and the
	// cleanup boundary use it as their commands do.
	Archive ops.ArchiveStore
	// Required and ReplayWindow are cleanup's required consumers and
	// cleanup.replay_window, for the cleanup boundary.
	Required     []string
	ReplayWindow time.Duration
	// Sink is where a resend goes (the configured sink); nil refuses
	// resends.
	Sink core.Sink
	// Token unlocks the actions (the token, or "sha256:<hex>") for anyone
	// holding it, who then types their name for the audit log. Empty with
	// no Operators keeps the console read-only.
	Token string
	// Operators maps an operator's name to their own token (or
	// "sha256:<hex>"): presenting it unlocks the actions and names them in
	// the audit log. Two operators may not share a token.
	Operators map[string]string
	// MaxTokenFailures is how many refused tokens from one address within
	// authguard.DefaultWindow make the console throttle it; 0 is
	// authguard.DefaultMax, negative turns throttling off.
	MaxTokenFailures int
	// ReadTimeout defaults to DefaultReadTimeout.
	ReadTimeout time.Duration
	// RelayMode is relay.mode, shown on the page.
	RelayMode string
	// SampleEvery, Window and BoundaryEvery default to DefaultSampleEvery,
	// DefaultWindow and DefaultBoundaryEvery.
	SampleEvery, Window, BoundaryEvery time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Console serves the operator console.
type Console struct {
	cfg       Config
	log       *slog.Logger
	tokens    core.Tokens // the shared Token
	opTokens  core.Tokens // Operators' tokens, in opNames' order
	opNames   []string
	guard     *authguard.Guard
	consumers []string
	history   history
	mux       *http.ServeMux

	// actionMu runs one action at a time: two operators releasing or
	// reconciling at once would only race each other.
	actionMu sync.Mutex

	mu         sync.Mutex
	lastRecon  *reconcileRun
	boundary   boundary
	boundaryAt time.Time
}

// reconcileRun is the last reconciliation the console ran.
type reconcileRun struct {
	At     time.Time
	Report ops.Report
	Err    string
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New returns a console; it reads nothing until Serve or Handler's first
// request.
func New(cfg Config) (*Console, error) {
	if cfg.Store == nil || cfg.Ledger == nil {
		return nil, errors.New("console: Store and Ledger are required")
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = DefaultSampleEvery
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.BoundaryEvery <= 0 {
		cfg.BoundaryEvery = DefaultBoundaryEvery
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.MaxTokenFailures == 0 {
		cfg.MaxTokenFailures = authguard.DefaultMax
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Console{cfg: cfg, log: cfg.Logger, history: history{window: cfg.Window}, mux: http.NewServeMux(),
		guard: authguard.New(cfg.MaxTokenFailures, authguard.DefaultWindow)}
	if cfg.Token != "" {
		ts, err := core.ParseTokens([]string{cfg.Token})
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		c.tokens = ts
	}
	if err := c.parseOperators(); err != nil {
		return nil, err
	}
	for _, s := range cfg.Consumers {
		c.consumers = append(c.consumers, s.Name)
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET /{$}", c.handlePage)
	c.mux.HandleFunc("GET /live", c.handleLive)
	c.mux.HandleFunc("GET /samples", c.handleSamples)
	c.mux.HandleFunc("GET /confirm", c.handleConfirm)
	c.mux.HandleFunc("POST /action/{action}", c.handleAction)
	c.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return c, nil
}

// parseOperators reads Config.Operators: names are printable, at most 64
// characters; a token may not name two operators, nor be the shared Token.
// Errors name the operator, never the token.
func (c *Console) parseOperators() error {
	c.opNames = slices.Sorted(maps.Keys(c.cfg.Operators))
	list := make([]string, len(c.opNames))
	for i, name := range c.opNames {
		if !validOperator(name) {
			return fmt.Errorf("console: operator %.70q: the name must be 1 to 64 printable characters", name)
		}
		list[i] = c.cfg.Operators[name]
		if _, err := core.ParseTokens(list[i : i+1]); err != nil {
			return fmt.Errorf("console: operator %q: the token is empty or a malformed sha256: hash", name)
		}
	}
	all := list
	if c.cfg.Token != "" {
		all = append(slices.Clip(list), c.cfg.Token)
	}
	ts, err := core.ParseTokens(all)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	if i, j, dup := ts.Duplicate(); dup {
		if j == len(list) {
			return fmt.Errorf("console: operator %q: the token is the shared console token; give each operator their own", c.opNames[i])
		}
		return fmt.Errorf("console: operators %q and %q have the same token", c.opNames[i], c.opNames[j])
	}
	c.opTokens, err = core.ParseTokens(list)
	return err
}

// validOperator reports whether name may name an operator in the audit
// log.
func validOperator(name string) bool {
	return name != "" && len(name) <= 64 && strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

// ReadOnly reports whether the actions are off (neither console.token nor
// console.operators).
func (c *Console) ReadOnly() bool { return c.tokens.Len() == 0 && c.opTokens.Len() == 0 }

// NamesOperators reports whether operators are named by their own tokens
// (Config.Operators) rather than by what the caller types.
func (c *Console) NamesOperators() bool { return c.opTokens.Len() > 0 }

// Handler serves the console. Cross-origin POSTs are refused before the
// console's own CSRF token is even looked at (net/http's
// CrossOriginProtection reads Sec-Fetch-Site and Origin), and no answer
// may be shown in another site's frame, where a click on it could be
// steered (clickjacking).
func (c *Console) Handler() http.Handler {
	protected := http.NewCrossOriginProtection().Handler(c.mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "frame-ancestors 'none'")
		protected.ServeHTTP(w, r)
	})
}

// Serve samples and serves on ln until ctx ends, then shuts the server
// down (in-flight requests get 5s) and returns nil.
func (c *Console) Serve(ctx context.Context, ln net.Listener) error {
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { c.sample(sctx) })
	defer wg.Wait()
	srv := &http.Server{Handler: c.Handler(), ReadHeaderTimeout: min(readHeaderTimeout, c.cfg.ReadTimeout),
		ReadTimeout: c.cfg.ReadTimeout, IdleTimeout: 2 * time.Minute,
		ErrorLog:    slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
		BaseContext: func(net.Listener) context.Context { return sctx }}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shut)
	<-done
	return err
}

// newCSRFToken is a fresh random token for the page's forms.
func newCSRFToken() string { return rand.Text() }

// knownConsumer reports whether name is one of the console's consumers.
func (c *Console) knownConsumer(name string) bool { return slices.Contains(c.consumers, name) }
