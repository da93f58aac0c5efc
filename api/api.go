// Package api serves the Posting API of contract.md: POST /v1/postings,
// GET /v1/postings/{journal_id}, GET /v1/accounts/{account}, /healthz and
// /readyz.
//
// Invariants:
//   - A request either commits one posting (journal, lines, revisions,
//     balances and outbox rows in one transaction) or writes nothing; a 4xx
//     answer never leaves a trace in the ledger.
//   - The same Idempotency-Key with the same request returns the first
//     response (200 instead of 201); with another request, 409. Concurrent
//     requests with one key produce one journal.
//   - Every error is application/problem+json (RFC 9457) whose detail names
//     the offending field, header or parameter, also given in "field".
//   - Bearer tokens are compared in constant time and never logged. A
//     refused token is logged (address and path, never the token), and an
//     address that fails Config.MaxTokenFailures times within a minute gets
//     429 for every authenticated request, right token or not, for a
//     minute (internal/authguard). With no
//     tokens configured authentication is off, and New logs so loudly. A
//     configured token may be its SHA-256 ("sha256:<hex>"): every token is
//     kept and compared as the SHA-256 of the token, so a hash in the
//     configuration accepts the token it was made from.
//   - With Config.TLS the API serves HTTPS only.
//   - With Config.TracerProvider every POST /v1/postings runs in a server
//     span that continues the caller's W3C traceparent (trace.go), and the
//     store gets that span in the context, so the posting's outbox rows
//     carry it; without one there is no span and no trace header.
//
// The package takes plain structs (Config) and a small Store port; koanf
// stays in cmd/ and configs/.
package api

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/authguard"
)

// Defaults and limits fixed by the contract.
const (
	// MaxBodyBytes is the largest accepted request body (413 above).
	MaxBodyBytes = 1 << 20
	// MaxIdempotencyKeyLen bounds the Idempotency-Key header.
	MaxIdempotencyKeyLen = 128
	// DefaultShutdownTimeout bounds how long in-flight requests may finish
	// after the context is cancelled.
	DefaultShutdownTimeout = 10 * time.Second
)

// TokenHashPrefix marks a configured token given as its SHA-256 in hex.
const TokenHashPrefix = core.TokenHashPrefix

// Store is what the API needs from the ledger (the Postgres adapter's
// ledgerstore.Store implements it). Readers answer core.ErrNotFound for an
// unknown journal or account; Post answers core.ErrIdempotencyConflict for
// a key used with a different request, and an error wrapping
// core.ErrIdempotencyKeyLost (an *core.IdempotencyKeyLostError) for a
// retry of a posting a ledger failover lost and its recovery could not
// re-commit; a retry of one it re-committed is answered as replayed.
//
// Who may implement it: ledgerstore.Store is the one implementation, and the
// API's guarantees are proven against it. Another implementation must
// commit a posting's journal, balances, outbox rows and idempotency key in
// one transaction, or none of them: the outbox rests on that atomicity.
type Store interface {
	Post(ctx context.Context, key string, p core.Posting) (res core.PostingResult, replayed bool, err error)
	Posting(ctx context.Context, journalID string) (core.CommittedPosting, error)
	Account(ctx context.Context, id string) (core.Account, error)
	Ping(ctx context.Context) error
}

// Config configures the server.
type Config struct {
	// Listen is the address ListenAndServe binds, host:port.
	Listen string
	// Tokens are the accepted bearer tokens; empty turns authentication off.
	// An entry "sha256:<64 hex digits>" is the SHA-256 of an accepted token.
	Tokens []string
	// TLS, when set, makes Serve speak HTTPS (with at least its
	// certificates set).
	TLS *tls.Config
	// ShutdownTimeout bounds the graceful shutdown; default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// TracerProvider, when set, traces the posting requests (trace.go);
	// nil is tracing off.
	TracerProvider trace.TracerProvider
	// MaxTokenFailures is how many refused tokens from one address within
	// authguard.DefaultWindow make the API throttle it; 0 is
	// authguard.DefaultMax, negative turns throttling off.
	MaxTokenFailures int
	// History, when set, refuses postings (503) while the ledger does not
	// run on the history an operator accepted: after a failover the new
	// primary may lack postings the world has seen, and new ones would
	// take their revisions. Reads go on. nil is no check.
	History HistoryGate
}

// HistoryGate says whether the ledger runs on the accepted history
// (adapters/postgres.HistoryWatch, read on every new connection).
type HistoryGate interface {
	Check(ctx context.Context) error
}

// Server is the Posting API.
type Server struct {
	cfg    Config
	store  Store
	log    *slog.Logger
	tokens core.Tokens
	mux    *http.ServeMux
	// tracer is nil with tracing off.
	tracer trace.Tracer
	// guard throttles token guessing; nil with throttling off.
	guard *authguard.Guard
	// historyHeld: the last history check refused (logged once per change).
	historyHeld atomic.Bool
}

// New returns a server on store. It logs a warning when authentication is off.
func New(cfg Config, store Store) (*Server, error) {
	if store == nil {
		return nil, errors.New("api: store is nil")
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, store: store, log: cfg.Logger, mux: http.NewServeMux()}
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	tokens, err := core.ParseTokens(cfg.Tokens)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	s.tokens = tokens
	if cfg.MaxTokenFailures == 0 {
		cfg.MaxTokenFailures = authguard.DefaultMax
	}
	s.guard = authguard.New(cfg.MaxTokenFailures, authguard.DefaultWindow)
	if s.tokens.Len() == 0 {
		s.log.Warn("Posting API AUTHENTICATION IS OFF: api.tokens is empty, so anyone who can reach the listener can post to the ledger; set api.tokens (POSTHORN_API__TOKENS) outside local development")
	} else {
		s.log.Info("Posting API authentication is on", "tokens", s.tokens.Len())
	}
	s.mux.HandleFunc("POST /v1/postings", s.traced("/v1/postings", s.auth(s.handlePost)))
	s.mux.HandleFunc("GET /v1/postings/{journal_id}", s.auth(s.handleGetPosting))
	s.mux.HandleFunc("GET /v1/accounts/{account}", s.auth(s.handleGetAccount))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	s.mux.HandleFunc("GET /readyz", s.handleReady)
	// Other methods on known paths: 405 as problem+json (ServeMux's own
	// 405 is plain text).
	for path, allow := range map[string]string{
		"/v1/postings":              "POST",
		"/v1/postings/{journal_id}": "GET, HEAD",
		"/v1/accounts/{account}":    "GET, HEAD",
		"/healthz":                  "GET, HEAD",
		"/readyz":                   "GET, HEAD",
	} {
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			s.problem(w, r, http.StatusMethodNotAllowed, "method-not-allowed", "Method Not Allowed", "method",
				fmt.Sprintf("method %.20q is not allowed here; use %s", r.Method, allow))
		})
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.problem(w, r, http.StatusNotFound, "not-found", "Not Found", "path", fmt.Sprintf("no resource at %.120q", r.URL.Path))
	})
	return s, nil
}

// Handler returns the HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.mux }

// ListenAndServe listens on Config.Listen and serves until ctx is
// cancelled; see Serve.
func (s *Server) ListenAndServe(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("api: listen on %s: %w", s.cfg.Listen, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled, then stops accepting, lets
// in-flight requests finish for up to ShutdownTimeout and returns nil. A
// request cut short by the timeout has its context cancelled, so its
// transaction rolls back and a retry with the same key is safe.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	s.log.Info("Posting API listening", "addr", ln.Addr().String(), "tls", s.cfg.TLS != nil)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("api: serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("Posting API shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("api: shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("api: serve: %w", err)
	}
	return nil
}

// auth checks the bearer token when tokens are configured. Every token is
// compared, in constant time, so the answer's timing tells nothing about
// which or how much of a token matched. An address throttled for failed
// tokens gets 429 before its token is looked at.
func (s *Server) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.tokens.Len() == 0 {
			next(w, r)
			return
		}
		addr := authguard.Host(r.RemoteAddr)
		if left, blocked := s.guard.Blocked(addr); blocked {
			w.Header().Set("Retry-After", strconv.Itoa(int(left.Seconds())+1))
			s.problem(w, r, http.StatusTooManyRequests, "too-many-failed-tokens", "Too Many Requests", "Authorization",
				fmt.Sprintf("too many refused tokens from this address; try again in %d s", int(left.Seconds())+1))
			return
		}
		h := r.Header.Get("Authorization")
		scheme, token, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			s.tokenFailed(r, addr, "malformed Authorization header")
			w.Header().Set("WWW-Authenticate", `Bearer realm="posthorn"`)
			s.problem(w, r, http.StatusUnauthorized, "unauthorized", "Unauthorized", "Authorization", "the Authorization header must be \"Bearer <token>\"")
			return
		}
		if !s.tokens.Match(token) {
			s.tokenFailed(r, addr, "bearer token not accepted")
			w.Header().Set("WWW-Authenticate", `Bearer realm="posthorn", error="invalid_token"`)
			s.problem(w, r, http.StatusUnauthorized, "unauthorized", "Unauthorized", "Authorization", "the bearer token in the Authorization header is not accepted")
			return
		}
		next(w, r)
	}
}

// tokenFailed counts and logs a refused token: the address and path, never
// the token or the header.
func (s *Server) tokenFailed(r *http.Request, addr, why string) {
	n, blocked := s.guard.Failed(addr)
	s.log.Warn("Posting API refused a token", "remote_addr", r.RemoteAddr, "method", r.Method, "path", r.URL.Path,
		"reason", why, "failures", n)
	if blocked {
		s.log.Warn("Posting API throttles an address for refused tokens: 429 to all its requests for the window",
			"remote_addr", addr, "failures", n, "window", authguard.DefaultWindow.String())
	}
}

func (s *Server) handlePost(w http.ResponseWriter, r *http.Request) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		s.problem(w, r, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported Media Type", "Content-Type",
			fmt.Sprintf("Content-Type must be application/json, got %.80q", r.Header.Get("Content-Type")))
		return
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		s.problem(w, r, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported Media Type", "Content-Type",
			fmt.Sprintf("Content-Type charset must be utf-8, got %.40q", cs))
		return
	}
	keys := r.Header.Values("Idempotency-Key")
	if len(keys) != 1 {
		detail := "the Idempotency-Key header is required"
		if len(keys) > 1 {
			detail = "the Idempotency-Key header must be given once"
		}
		s.problem(w, r, http.StatusBadRequest, "malformed-request", "Malformed Request", "Idempotency-Key", detail)
		return
	}
	key := keys[0]
	if msg := checkKey(key); msg != "" {
		s.problem(w, r, http.StatusBadRequest, "malformed-request", "Malformed Request", "Idempotency-Key", msg)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.problem(w, r, http.StatusRequestEntityTooLarge, "body-too-large", "Content Too Large", "body",
				fmt.Sprintf("the request body exceeds %d bytes", MaxBodyBytes))
			return
		}
		s.problem(w, r, http.StatusBadRequest, "malformed-request", "Malformed Request", "body", "the request body could not be read")
		return
	}
	p, err := core.ParsePosting(body)
	if err != nil {
		s.inputProblem(w, r, err)
		return
	}
	if !s.historyAccepted(r.Context()) {
		s.refuseHistory(w, r)
		return
	}
	res, replayed, err := s.store.Post(r.Context(), key, p)
	switch {
	case err == nil:
	case errors.Is(err, core.ErrHistoryNotAccepted):
		// The store checked once its connection was acquired: one opened
		// to a promoted standby since the check above read the new history.
		s.historyAccepted(r.Context())
		s.refuseHistory(w, r)
		return
	case errors.Is(err, core.ErrIdempotencyConflict):
		s.problem(w, r, http.StatusConflict, "idempotency-conflict", "Idempotency Key Reused", "Idempotency-Key",
			"the Idempotency-Key was already used for a different request; use a new key for a new posting")
		return
	case errors.Is(err, core.ErrInvalidPosting):
		s.inputProblem(w, r, err)
		return
	case errors.Is(err, core.ErrIdempotencyKeyLost):
		var journal string
		if lost, ok := errors.AsType[*core.IdempotencyKeyLostError](err); ok {
			journal = lost.JournalID
		}
		s.log.Warn("a retry of a posting lost in a ledger failover was refused", "journal_id", journal)
		s.writeProblem(w, r, Problem{Type: ProblemTypePrefix + "idempotency-key-lost-in-failover", Title: "Idempotency Key Lost In Failover",
			Status: http.StatusConflict, Field: "Idempotency-Key", JournalID: journal,
			Detail: fmt.Sprintf("this Idempotency-Key was answered with journal %s before a ledger failover lost that posting, and the recovery could not re-commit it; "+
				"posting it again could move the money twice, so it is refused: ask the ledger's operators (posthorn failover check names the journal)", journal)})
		return
	default:
		s.internal(w, r, "post", err)
		return
	}
	status := http.StatusCreated
	if replayed {
		status = http.StatusOK
	} else {
		s.log.Debug("posting committed", "journal_id", res.JournalID, "sequence", res.Sequence, "lines", len(res.Events))
	}
	postedSpan(r.Context(), res, replayed)
	w.Header().Set("Location", "/v1/postings/"+res.JournalID)
	writeJSON(w, status, res)
}

// checkKey returns why key is unacceptable, or "".
func checkKey(key string) string {
	if key == "" {
		return "the Idempotency-Key header is empty"
	}
	if len(key) > MaxIdempotencyKeyLen {
		return fmt.Sprintf("the Idempotency-Key header is %d characters long, at most %d are allowed", len(key), MaxIdempotencyKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Sprintf("the Idempotency-Key header has a non-printable or non-ASCII byte at position %d", i)
		}
	}
	return ""
}

func (s *Server) handleGetPosting(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("journal_id")
	if _, err := uuid.Parse(id); err != nil {
		s.problem(w, r, http.StatusBadRequest, "malformed-request", "Malformed Request", "journal_id",
			fmt.Sprintf("journal_id %.80q is not a UUID", id))
		return
	}
	p, err := s.store.Posting(r.Context(), id)
	if s.readFailed(w, r, err, "journal_id", fmt.Sprintf("no posting with journal_id %q", id), "read posting") {
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// readFailed answers a failed read of the store, if err is one, and
// reports whether it did: 404 naming field with detail when the store has
// no such thing (core.ErrNotFound), 500 for anything else, logged as what.
func (s *Server) readFailed(w http.ResponseWriter, r *http.Request, err error, field, detail, what string) bool {
	switch {
	case errors.Is(err, core.ErrNotFound):
		s.problem(w, r, http.StatusNotFound, "not-found", "Not Found", field, detail)
	case err != nil:
		s.internal(w, r, what, err)
	default:
		return false
	}
	return true
}

// accountBody is the GET /v1/accounts/{account} answer; balances are
// decimal strings so no JSON reader rounds them through a float.
type accountBody struct {
	Account  string            `json:"account"`
	Balances map[string]string `json:"balances"`
	Revision int64             `json:"revision"`
}

func (s *Server) handleGetAccount(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("account")
	if !core.ValidAccountID(id) {
		s.problem(w, r, http.StatusBadRequest, "malformed-request", "Malformed Request", "account",
			fmt.Sprintf("account %.80q must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$", id))
		return
	}
	acc, err := s.store.Account(r.Context(), id)
	if s.readFailed(w, r, err, "account", fmt.Sprintf("no account %q", id), "read account") {
		return
	}
	body := accountBody{Account: acc.ID, Balances: make(map[string]string, len(acc.Balances)), Revision: acc.Revision}
	for c, b := range acc.Balances {
		body.Balances[c] = strconv.FormatInt(b, 10)
	}
	writeJSON(w, http.StatusOK, body)
}

// historyAccepted checks Config.History; the first refusal is logged at
// ERROR, the return to the accepted history at INFO.
func (s *Server) historyAccepted(ctx context.Context) bool {
	if s.cfg.History == nil {
		return true
	}
	err := s.cfg.History.Check(ctx)
	if err != nil && !s.historyHeld.Swap(true) {
		s.log.Error("API REFUSES POSTINGS: the ledger's history is not the accepted one; run posthorn failover check, then posthorn failover recover (docs/operations.md)", "err", err)
	}
	if err == nil && s.historyHeld.Swap(false) {
		s.log.Info("the ledger's history is accepted: postings are taken again")
	}
	return err == nil
}

// refuseHistory answers a posting refused on an unaccepted history.
func (s *Server) refuseHistory(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "5")
	s.problem(w, r, http.StatusServiceUnavailable, "ledger-history-not-accepted", "Service Unavailable", "database",
		"the ledger failed over or was restored, and an operator has not yet accepted its new history (posthorn failover recover); nothing was written: retry with the same Idempotency-Key later")
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.log.Warn("readiness check failed", "err", err)
		s.problem(w, r, http.StatusServiceUnavailable, "not-ready", "Service Unavailable", "database", "the ledger database does not answer")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ready\n")
}

// Problem is an RFC 9457 problem detail with Posthorn's "field" member.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Field names the JSON path (entries[1].amount), header
	// (Idempotency-Key) or path parameter (account) at fault.
	Field string `json:"field,omitempty"`
	// JournalID names the posting a refused retry belongs to
	// (idempotency-key-lost-in-failover).
	JournalID string `json:"journal_id,omitempty"`
}

// ProblemTypePrefix prefixes every problem type; the suffix is stable.
const ProblemTypePrefix = "tag:posthorn.dev,2026:problem/"

func (s *Server) inputProblem(w http.ResponseWriter, r *http.Request, err error) {
	var ie *core.InputError
	if !errors.As(err, &ie) {
		s.internal(w, r, "classify input error", err)
		return
	}
	field := ie.Field
	if field == "" {
		field = "body"
	}
	if ie.Malformed {
		s.problem(w, r, http.StatusBadRequest, "malformed-request", "Malformed Request", field, field+": "+ie.Detail)
		return
	}
	s.problem(w, r, http.StatusUnprocessableEntity, "invalid-posting", "Invalid Posting", field, field+": "+ie.Detail)
}

func (s *Server) problem(w http.ResponseWriter, r *http.Request, status int, slug, title, field, detail string) {
	s.writeProblem(w, r, Problem{Type: ProblemTypePrefix + slug, Title: title, Status: status, Detail: detail, Field: field})
}

func (s *Server) writeProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	s.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", p.Status, "field", p.Field, "detail", p.Detail)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// internal answers 500 without details (they may contain SQL or values)
// and logs the cause.
func (s *Server) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	if r.Context().Err() != nil {
		// The client went away or the server is stopping: the transaction
		// rolled back; nobody reads this answer.
		s.log.Info("request cancelled", "method", r.Method, "path", r.URL.Path, "during", what)
	} else {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "during", what, "err", err)
	}
	s.problem(w, r, http.StatusInternalServerError, "internal", "Internal Server Error", "", "the request failed on the server; its outcome may be unknown, so retry it with the same Idempotency-Key")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
