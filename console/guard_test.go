package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres/consolestore"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/console"
	"github.com/posthorn/posthorn/internal/authguard"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/ops"
)

const (
	sharedToken = "shared-console-token-0123"
	aliceToken  = "alice-own-token-0123456789"
	bobToken    = "bob-own-token-0123456789ab"
)

// rig is a console over a fresh ledger and consumer database, its log,
// and the ledger pool the audit log is read from.
type rig struct {
	c     *console.Console
	cfg   console.Config // c's, stores included
	audit func(t *testing.T) []string
	logs  *syncbuf.Buffer
}

func newConsole(t *testing.T, cfg console.Config) rig {
	t.Helper()
	_, ledger := pgtest.Ledger(t)
	_, consumer := pgtest.Consumer(t)
	logs := &syncbuf.Buffer{}
	cfg.Store = consolestore.New(consolestore.Config{Ledger: ledger})
	cfg.Ledger = opsstore.New(ledger)
	cfg.Consumers = []ops.ConsumerSource{{Name: "audit-log", Reader: ops.InboxReader{Inbox: inboxstore.New(consumer), Consumer: "audit-log"}}}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rig{c: c, cfg: cfg, logs: logs, audit: func(t *testing.T) []string {
		rows, err := ledger.Query(context.Background(), `SELECT operator FROM console_audit ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ops []string
		for rows.Next() {
			var op string
			if err := rows.Scan(&op); err != nil {
				t.Fatal(err)
			}
			ops = append(ops, op)
		}
		return ops
	}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// browser opens reconcile's confirmation page on base, keeping the CSRF
// cookie, and returns a function posting the action's form with token and
// the typed operator name; it returns the status.
func browser(t *testing.T, base string) func(token, operator string) int {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(base + "/confirm?action=reconcile")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfField.FindSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on the confirmation page:\n%s", body)
	}
	return func(token, operator string) int {
		resp, err := client.PostForm(base+"/action/reconcile", url.Values{"csrf": {string(m[1])}, "token": {token}, "operator": {operator}})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
}

// Every answer of the console, page, form, action, static file or health
// check, forbids being framed. Negative control: the handler without the
// headers (as it was) leaves a page frameable.
func TestConsoleRefusesFraming(t *testing.T) {
	t.Parallel()
	r := newConsole(t, console.Config{Token: sharedToken})
	frameable := func(h http.Handler, path string) bool {
		rec := httptest.NewRecorder()
		method := http.MethodGet
		if strings.HasPrefix(path, "/action/") {
			method = http.MethodPost
		}
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Header().Get("X-Frame-Options") != "DENY" || rec.Header().Get("Content-Security-Policy") != "frame-ancestors 'none'"
	}
	for _, path := range []string{"/", "/confirm?action=reconcile", "/action/reconcile", "/static/console.css", "/healthz", "/nowhere"} {
		if frameable(r.c.Handler(), path) {
			t.Errorf("%s may be framed", path)
		}
	}
	if !frameable(r.c.UnframedHandler(), "/") {
		t.Fatal("negative control: the handler without the headers is not frameable either; the check proves nothing")
	}
}

// A client that sends its headers and then trickles its body is cut off
// at ReadTimeout. Negative control: the server as it was (a header
// timeout only) keeps the same connection open.
func TestConsoleCutsOffATrickledBody(t *testing.T) {
	t.Parallel()
	const readTimeout = 400 * time.Millisecond
	r := newConsole(t, console.Config{Token: sharedToken, ReadTimeout: readTimeout})
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.c.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	if open := trickle(t, ln.Addr().String(), 5*readTimeout); open {
		t.Fatalf("the connection is still open %v after ReadTimeout %v", 5*readTimeout, readTimeout)
	}

	old := &http.Server{Handler: r.c.Handler(), ReadHeaderTimeout: 10 * time.Second}
	oldLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = old.Serve(oldLn) }()
	defer old.Close()
	if open := trickle(t, oldLn.Addr().String(), 5*readTimeout); !open {
		t.Fatal("negative control: the server without ReadTimeout cut the trickle off too; the test proves nothing")
	}
}

// trickle sends a POST's headers to addr, then one body byte every 50 ms,
// for d, and reports whether the server still held the connection open
// without answering.
func trickle(t *testing.T, addr string, d time.Duration) (open bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /action/reconcile HTTP/1.1\r\nHost: console\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		_, _ = conn.Read(make([]byte, 1)) // returns on an answer or a close
		close(closed)
	}()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case <-closed:
			return false
		case <-time.After(50 * time.Millisecond):
		}
		if _, err := conn.Write([]byte("a")); err != nil {
			return false
		}
	}
	select {
	case <-closed:
		return false
	default:
		return true
	}
}

// 200 wrong tokens from one address: the first authguard.DefaultMax are
// refused (401) and logged without what was presented, then the address
// gets 429, the right token included. Negative control: with throttling
// off, all 200 are answered 401 and the right token, guessed last, runs
// the action.
func TestConsoleThrottlesAndLogsFailedTokens(t *testing.T) {
	t.Parallel()
	guess := func(maxFailures int) (map[int]int, int, string) {
		r := newConsole(t, console.Config{Token: sharedToken, MaxTokenFailures: maxFailures})
		ts := httptest.NewServer(r.c.Handler())
		defer ts.Close()
		post := browser(t, ts.URL)
		statuses := map[int]int{}
		for i := range 200 {
			statuses[post("guess-"+strings.Repeat("z", i%9)+bobToken, "mallory")]++
		}
		return statuses, post(sharedToken, "mallory"), r.logs.String()
	}
	statuses, last, logs := guess(0)
	if statuses[http.StatusUnauthorized] != authguard.DefaultMax || statuses[http.StatusTooManyRequests] != 200-authguard.DefaultMax || last != http.StatusTooManyRequests {
		t.Fatalf("statuses %v, then the right token %d; want %d×401, the rest and the right token 429", statuses, last, authguard.DefaultMax)
	}
	if n := strings.Count(logs, "console refused a token"); n != authguard.DefaultMax || !strings.Contains(logs, "console throttles an address") {
		t.Errorf("%d refusal lines (want %d) and a throttling line:\n%s", n, authguard.DefaultMax, logs)
	}
	if strings.Contains(logs, "guess-") || strings.Contains(logs, bobToken) || strings.Contains(logs, sharedToken) {
		t.Fatalf("a presented token reached the log:\n%s", logs)
	}
	statuses, last, _ = guess(-1)
	if statuses[http.StatusUnauthorized] != 200 || last != http.StatusSeeOther {
		t.Fatalf("negative control: with throttling off, statuses %v and the right token %d; want 200×401 and 303 (ran)", statuses, last)
	}
}

// With console.operators the audit log names the operator whose token was
// presented, whatever name the form carries; a token given as its hash
// names its operator too. Negative control: with the shared console.token
// the audit log says whatever the caller typed.
func TestConsoleNamesTheOperatorFromTheirToken(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte(bobToken))
	r := newConsole(t, console.Config{Token: sharedToken,
		Operators: map[string]string{"alice": aliceToken, "bob": "sha256:" + hex.EncodeToString(sum[:])}})
	ts := httptest.NewServer(r.c.Handler())
	defer ts.Close()
	post := browser(t, ts.URL)
	for _, tc := range []struct{ token, typed string }{{aliceToken, "mallory"}, {bobToken, "alice"}, {sharedToken, "mallory"}} {
		if status := post(tc.token, tc.typed); status != http.StatusSeeOther {
			t.Fatalf("action with the token of %q: %d", tc.typed, status)
		}
	}
	if got := strings.Join(r.audit(t), ","); got != "alice,bob,mallory" {
		t.Fatalf("audit log operators %q, want alice,bob (from their tokens) then mallory (typed with the shared token)", got)
	}

	// With operators only, the confirmation page asks for no name.
	only := newConsole(t, console.Config{Operators: map[string]string{"alice": aliceToken}})
	rec := httptest.NewRecorder()
	only.c.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/confirm?action=reconcile", nil))
	if body := rec.Body.String(); strings.Contains(body, `name="operator"`) || !strings.Contains(body, "your operator token") {
		t.Fatalf("the confirmation page with operator tokens only:\n%s", body)
	}
	for _, bad := range []map[string]string{
		{"alice": aliceToken, "bob": aliceToken},
		{"alice": sharedToken},
		{"alice": "sha256:" + hex.EncodeToString(sum[:]), "bob": bobToken},
		{"": aliceToken},
		{"al\x1bice": aliceToken},
	} {
		cfg := r.cfg
		cfg.Operators = bad
		_, err := console.New(cfg)
		if err == nil || strings.Contains(err.Error(), aliceToken) || strings.Contains(err.Error(), bobToken) {
			t.Errorf("operators %q: err %v, want a refusal that names no token", keys(bad), err)
		}
	}
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
