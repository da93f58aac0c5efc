package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/console"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// consoleToken is the console.token of the tests' consoles.
const consoleToken = "console-test-token-0123456789"

// consoleRig is a console served over the ops rig's databases (opsCLIRig),
// resending through a memory sink, with a browser-like HTTP client that
// keeps the CSRF cookie.
type consoleRig struct {
	*opsCLIRig
	console *console.Console
	url     string
	sink    *memory.Sink
	client  *http.Client
	logs    *bytes.Buffer
}

// newConsoleRig serves a console with token as console.token ("" for a
// read-only one) and a memory sink of sinkCfg, until the test ends.
func newConsoleRig(t *testing.T, token string, sinkCfg memory.Config) *consoleRig {
	t.Helper()
	r := &consoleRig{opsCLIRig: newOpsCLIRig(t), sink: memory.New(sinkCfg), logs: &bytes.Buffer{}}
	t.Cleanup(func() { _ = r.sink.Close() })
	env := append([]string{}, r.env...)
	if token != "" {
		env = append(env, "POSTHORN_CONSOLE__TOKEN="+token)
	}
	cfg, err := configs.Load("", env, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewJSONHandler(r.logs, nil))
	c, closeConsole, err := openConsole(ctx, cfg, r.ledger, r.sink, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serveConsoleOn(ctx, c, ln, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
		closeConsole()
	})
	r.console, r.url, r.client = c, "http://"+ln.Addr().String(), formClient()
	return r
}

// formClient is a browser's part in a form post: it keeps cookies (the
// CSRF token's) and shows redirects instead of following them.
func formClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// get fetches path and returns the status and body.
func (r *consoleRig) get(path string) (int, string) {
	r.t.Helper()
	resp, err := r.client.Get(r.url + path)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var (
	csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	doneNote  = regexp.MustCompile(`<p class="done" role="status">([^<]*)</p>`)
)

// confirm opens the confirmation page of action with params, as the
// page's button does, and returns its CSRF token.
func (r *consoleRig) confirm(action string, params url.Values) string {
	r.t.Helper()
	q := url.Values{"action": {action}}
	for k, v := range params {
		q[k] = v
	}
	_, body := r.get("/confirm?" + q.Encode())
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		r.t.Fatalf("confirmation page of %s has no CSRF token:\n%s", action, body)
	}
	return m[1]
}

// post submits an action's form and returns the status, the Location and
// the body.
func (r *consoleRig) post(action string, form url.Values) (int, string, string) {
	r.t.Helper()
	resp, err := r.client.PostForm(r.url+"/action/"+action, form)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

// count runs a count(*) query on pool ledger or consumer.
func (r *consoleRig) count(consumerDB bool, sql string) int {
	r.t.Helper()
	pool := r.ledger
	if consumerDB {
		pool = r.consumer
	}
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// state is what any action could change: parked aggregates on both sides,
// the pending outbox rows (a resend marks them), recorded coverage, the
// audit log, and what the sink received.
func (r *consoleRig) state() string {
	r.t.Helper()
	return fmt.Sprint(
		r.count(false, `SELECT count(*) FROM relay_parked`),
		r.count(true, `SELECT count(*) FROM consumer_positions WHERE parked`),
		r.count(false, `SELECT count(*) FROM outbox_pending`),
		r.count(false, `SELECT count(*) FROM ops_coverage`),
		r.count(false, `SELECT count(*) FROM console_audit`),
		len(r.sink.Records(core.TopicEvents)),
	)
}

// parkBoth posts, delivers to the consumers with acc-1 parked in the
// projection, and parks acc-2 on the relay (the call the relay makes when
// the sink rejects a record for good). It returns an event ID of acc-2.
func (r *consoleRig) parkBoth() string {
	r.t.Helper()
	events := r.postings(4)
	if parked := r.deliver("acc-1"); len(parked) == 0 {
		r.t.Fatal("acc-1 did not park in the projection")
	}
	var acc2 string
	for _, e := range events {
		if e.Account == "acc-2" {
			acc2 = e.EventID
			break
		}
	}
	if _, err := relaystore.New(r.ledger).Park(context.Background(), core.ParkedAggregate{
		AggregateType: core.AggregateAccount, AggregateID: "acc-2", EventID: acc2, Reason: "sink rejected it for good: test",
	}); err != nil {
		r.t.Fatal(err)
	}
	return acc2
}

// Every action refuses bad input, a missing or wrong token, and a missing
// or foreign CSRF token with an error naming the field, and changes
// nothing: no release, no resend, no coverage, no audit entry.
func TestConsoleActionsRefuseBadInput(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, consoleToken, memory.Config{})
	r.parkBoth()
	good := func(kv ...string) url.Values {
		f := url.Values{"operator": {"alice"}, "token": {consoleToken}}
		for i := 0; i+1 < len(kv); i += 2 {
			f.Set(kv[i], kv[i+1])
		}
		return f
	}
	before := r.state()
	for _, tc := range []struct {
		name, action string
		form         url.Values
		csrf         string // "" takes the page's; "-" sends none
		status       int
		want         string
	}{
		{"no CSRF token", "release-relay", good("aggregate_id", "acc-2"), "-", 403, "csrf: missing"},
		{"foreign CSRF token", "release-relay", good("aggregate_id", "acc-2"), "not-the-page-token", 403, "csrf: does not match"},
		{"no token", "release-relay", url.Values{"operator": {"alice"}, "aggregate_id": {"acc-2"}}, "", 401, "token: is required"},
		{"wrong token", "release-relay", good("aggregate_id", "acc-2", "token", "console-test-token-wrong"), "", 401, "token: is not accepted"},
		{"no operator", "release-relay", good("aggregate_id", "acc-2", "operator", ""), "", 422, "operator: is required"},
		{"relay: unknown account", "release-relay", good("aggregate_id", "acc-nobody"), "", 422, `aggregate_id: account &#34;acc-nobody&#34; is not parked on the relay`},
		{"relay: malformed account", "release-relay", good("aggregate_id", "acc 2; drop"), "", 422, "aggregate_id: &#34;acc 2; drop&#34; is not an account ID"},
		{"relay: bad aggregate type", "release-relay", good("aggregate_id", "acc-2", "aggregate_type", "led ger;"), "", 422, "aggregate_type: is &#34;led ger;&#34;"},
		{"relay: wallet not parked", "release-relay", good("aggregate_id", "w-9", "aggregate_type", "wallet"), "", 422, `aggregate_id: wallet &#34;w-9&#34; is not parked on the relay`},
		{"relay: aggregate ID too long", "release-relay", good("aggregate_id", strings.Repeat("w", 257), "aggregate_type", "wallet"), "", 422, "aggregate_id: is 257 bytes, want at most 256"},
		{"consumer: unknown consumer", "release-consumer", good("consumer", "nobody", "aggregate_id", "acc-1"), "", 422, "consumer: &#34;nobody&#34; is not one of"},
		{"consumer: account not parked there", "release-consumer", good("consumer", projection.Name, "aggregate_id", "acc-2"), "", 422, "aggregate_id: account &#34;acc-2&#34; is not parked in consumer balance-projection"},
		{"resend: malformed event ID", "resend", good("event_id", "0194-not-a-uuid"), "", 422, "event_id: &#34;0194-not-a-uuid&#34; is not an event ID"},
		{"resend: unknown event ID", "resend", good("event_id", "01940000-0000-7000-8000-000000000000"), "", 422, "event_id: 01940000-0000-7000-8000-000000000000 is not in the outbox"},
		{"resend: no event ID", "resend", good(), "", 422, "event_id: is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			csrf := r.confirm(tc.action, nil)
			switch tc.csrf {
			case "-":
				csrf = ""
			case "":
			default:
				csrf = tc.csrf
			}
			f := url.Values{}
			for k, v := range tc.form {
				f[k] = v
			}
			if csrf != "" {
				f.Set("csrf", csrf)
			}
			status, _, body := r.post(tc.action, f)
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("status %d, want %d with %q in:\n%s", status, tc.status, tc.want, body)
			}
			if after := r.state(); after != before {
				t.Fatalf("state changed from %s to %s", before, after)
			}
		})
	}
	// A form posted from another site, with every field right, is refused
	// before the console reads it (http.CrossOriginProtection).
	f := good("aggregate_id", "acc-2")
	f.Set("csrf", r.confirm("release-relay", nil))
	req, _ := http.NewRequest(http.MethodPost, r.url+"/action/release-relay", strings.NewReader(f.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || r.state() != before {
		t.Fatalf("cross-site post: status %d, state %s (was %s)", resp.StatusCode, r.state(), before)
	}
	if strings.Contains(r.logs.String(), consoleToken) {
		t.Fatal("the console logged its token")
	}
}

// A console without console.token is read-only: it says so, and refuses
// every action with an error naming the token, changing nothing.
func TestConsoleReadOnlyRefusesActions(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, "", memory.Config{})
	r.parkBoth()
	before := r.state()
	if _, body := r.get("/"); !strings.Contains(body, "read-only (console.token is not set)") {
		t.Fatalf("page does not say read-only:\n%s", body)
	}
	csrf := r.confirm("release-relay", url.Values{"aggregate_id": {"acc-2"}})
	status, _, body := r.post("release-relay", url.Values{"csrf": {csrf}, "operator": {"alice"}, "aggregate_id": {"acc-2"}, "token": {consoleToken}})
	if status != http.StatusForbidden || !strings.Contains(body, "token: the console is read-only") {
		t.Fatalf("status %d:\n%s", status, body)
	}
	if after := r.state(); after != before {
		t.Fatalf("state changed from %s to %s", before, after)
	}
	if !strings.Contains(r.logs.String(), "operator console is read-only") {
		t.Fatalf("the log does not say read-only: %s", r.logs)
	}
}

// With the token, each action does what its CLI command does and is in
// the audit log with who and when; the page (no JavaScript needed) shows
// the parked rows before and not after.
func TestConsoleActionsRunAndAreAudited(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, consoleToken, memory.Config{})
	acc2 := r.parkBoth()
	_, page := r.get("/")
	for _, want := range []string{`<tr data-aggregate="acc-2">`, `<tr data-consumer="balance-projection" data-aggregate="acc-1">`, acc2, "sink rejected it for good: test", "handler failed: test poison"} {
		if !strings.Contains(page, want) {
			t.Fatalf("page lacks %q:\n%s", want, page)
		}
	}
	run := func(action string, f url.Values) string {
		t.Helper()
		f.Set("csrf", r.confirm(action, f))
		f.Set("operator", "alice")
		f.Set("token", consoleToken)
		status, loc, body := r.post(action, f)
		if status != http.StatusSeeOther {
			t.Fatalf("%s: status %d:\n%s", action, status, body)
		}
		// Sent back to the page, which shows the outcome from the audit log.
		_, page := r.get(loc)
		m := doneNote.FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("%s: the page at %s shows no outcome:\n%s", action, loc, page)
		}
		return m[1]
	}

	if done := run("release-relay", url.Values{"aggregate_id": {"acc-2"}}); !strings.Contains(done, "account acc-2 released") {
		t.Fatalf("release-relay: %q", done)
	}
	// Aggregates a team publishes (posthorn_publish) park and are released
	// the same way as the ledger's accounts.
	if _, err := relaystore.New(r.ledger).Park(context.Background(), core.ParkedAggregate{
		AggregateType: "wallet", AggregateID: "w-1", EventID: acc2, Reason: "sink rejected it for good: test",
	}); err != nil {
		t.Fatal(err)
	}
	if done := run("release-relay", url.Values{"aggregate_type": {"wallet"}, "aggregate_id": {"w-1"}}); !strings.Contains(done, "wallet w-1 released") {
		t.Fatalf("release-relay of a wallet: %q", done)
	}
	if n := r.count(false, `SELECT count(*) FROM relay_parked`); n != 0 {
		t.Fatalf("relay_parked has %d rows after the release", n)
	}
	if done := run("release-consumer", url.Values{"consumer": {projection.Name}, "aggregate_id": {"acc-1"}}); !strings.Contains(done, "released") {
		t.Fatalf("release-consumer: %q", done)
	}
	if n := r.count(true, `SELECT count(*) FROM consumer_positions WHERE parked`); n != 0 {
		t.Fatalf("%d consumer parks after the release", n)
	}
	if done := run("resend", url.Values{"event_id": {acc2}}); !strings.Contains(done, "resent 1 row") {
		t.Fatalf("resend: %q", done)
	}
	recs := r.sink.Records(core.TopicEvents)
	if len(recs) != 1 || recs[0].UUID != acc2 || recs[0].Metadata.Get("resend") != "true" {
		t.Fatalf("sink got %d records, want %s with resend: true", len(recs), acc2)
	}
	if done := run("reconcile", url.Values{}); !strings.Contains(done, "cut at journal sequence") {
		t.Fatalf("reconcile: %q", done)
	}

	var who, outcomes string
	if err := r.ledger.QueryRow(context.Background(), `SELECT string_agg(DISTINCT operator, ','), string_agg(action || '=' || outcome, ',' ORDER BY id)
FROM console_audit WHERE finished_at >= at AND at > now() - interval '1 minute' AND remote_addr LIKE '127.0.0.1:%'`).Scan(&who, &outcomes); err != nil {
		t.Fatal(err)
	}
	if who != "alice" || outcomes != "release-relay=ok,release-relay=ok,release-consumer=ok,resend=ok,reconcile=ok" {
		t.Fatalf("audit log: operators %q, actions %q", who, outcomes)
	}
	_, page = r.get("/")
	for _, gone := range []string{`<tr data-aggregate="acc-2">`, `data-aggregate="acc-1"`} {
		if strings.Contains(page, gone) {
			t.Fatalf("page still shows %q after the release", gone)
		}
	}
	if !strings.Contains(page, "Last reconcile from this console") || !strings.Contains(page, "<td>alice</td>") ||
		!strings.Contains(page, "balance-projection's history checked whole (no clean pass has recorded a mark yet)") {
		t.Fatalf("page lacks the reconcile, how far back it read, or the audit log:\n%s", page)
	}
	// The outcome shown comes from the audit log, never from the link.
	if _, forged := r.get("/?done=" + url.QueryEscape("all balances zeroed")); strings.Contains(forged, "all balances zeroed") || strings.Contains(forged, `role="status"`) {
		t.Fatal("the page shows an outcome the link made up")
	}
}

// `posthorn demo --console` serves the console during the run and keeps it
// up after the summary, over the run's databases, until SIGINT; then it
// exits 0.
func TestConsoleDemoKeepsItUp(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := cliCommand([]string{
		"POSTHORN_DATABASE__URL=" + pgtest.NewDatabase(t),
		"POSTHORN_CONSUMER__DATABASE__URL=" + pgtest.NewDatabase(t),
		"POSTHORN_CONSOLE__LISTEN=" + addr,
	}, "demo", "--console", "--sink", "memory", "--postings", "60", "--json")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	startCLI(t, cmd)
	// stderr is read only once the process has ended.
	fail := func(format string, args ...any) {
		t.Helper()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf(format+"\nstderr:\n%s", append(args, stderr.String())...)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		fail("no summary: %v", err)
	}
	var sum demoSummary
	if err := json.Unmarshal([]byte(line), &sum); err != nil || sum.Reconcile != "clean" {
		fail("summary %q: %v", line, err)
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		fail("the console is not up after the run: %v", err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := fmt.Sprintf("applied %d", sum.Applied)
	if resp.StatusCode != 200 || !strings.Contains(string(page), want) || !strings.Contains(string(page), "read-only") {
		fail("status %d, page lacks %q or read-only:\n%s", resp.StatusCode, want, page)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGINT: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "operator console: http://"+addr+"/") {
		t.Fatalf("stderr does not name the console's address:\n%s", stderr.String())
	}
}

// `posthorn console` serves on --listen (over console.listen), logs where
// without the token, and stops on SIGINT with exit 0; a bad --listen stops
// it at start naming the key.
func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	r := newOpsCLIRig(t)
	code, _, stderr := runCLI(t, r.env, "console", "--listen", "nowhere")
	if code != 1 || !strings.Contains(stderr, "--listen: config key console.listen") {
		t.Fatalf("bad --listen: code %d, %s", code, stderr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := cliCommand(append(r.env, "POSTHORN_CONSOLE__LISTEN=127.0.0.1:1", "POSTHORN_CONSOLE__TOKEN="+consoleToken, "POSTHORN_LOG__FORMAT=json"),
		"console", "--listen", addr)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	startCLI(t, cmd)
	wait.ForStatus(t, 30*time.Second, "the console to come up on "+addr, func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "actions need the console token") {
			t.Fatalf("status %d:\n%s", resp.StatusCode, body)
		}
		return true, ""
	})
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGINT: %v\n%s", err, errOut.String())
	}
	logs := errOut.String()
	if !strings.Contains(logs, "operator console listening") || !strings.Contains(logs, addr) || strings.Contains(logs, consoleToken) {
		t.Fatalf("log does not name the address, or names the token:\n%s", logs)
	}
}

// The console reads as posthorn_reconciler on the ledger and on the
// consumers' database, as reconcile does: the page shows everything, and a
// reconcile from the console runs and is audited under that role.
func TestConsoleReadsAsTheReconciler(t *testing.T) {
	t.Parallel()
	r := &consoleRig{opsCLIRig: newOpsCLIRig(t), logs: &bytes.Buffer{}, client: formClient()}
	r.parkBoth()
	urls := map[string]string{}
	for _, kv := range r.env {
		k, v, _ := strings.Cut(kv, "=")
		urls[k] = v
	}
	ledgerURL, consumerURL := urls["POSTHORN_DATABASE__URL"], urls["POSTHORN_CONSUMER__DATABASE__URL"]
	roletest.Apply(t, ledgerURL, postgres.LedgerSchema)
	roletest.Apply(t, consumerURL, postgres.ConsumerSchema)
	asLedger := roletest.Login(t, ledgerURL, postgres.RoleReconciler, "")
	asConsumer := roletest.Login(t, consumerURL, postgres.RoleReconciler, "")
	cfg, err := configs.Load("", []string{"POSTHORN_DATABASE__URL=" + asLedger, "POSTHORN_CONSUMER__DATABASE__URL=" + asConsumer,
		"POSTHORN_CONSOLE__TOKEN=" + consoleToken}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, closeConsole, err := openConsole(context.Background(), cfg, roletest.Pool(t, asLedger), nil, nil, slog.New(slog.NewJSONHandler(r.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeConsole)
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	r.url = srv.URL
	status, page := r.get("/")
	if status != 200 || strings.Contains(page, "could not read") ||
		!strings.Contains(page, `<tr data-aggregate="acc-2">`) || !strings.Contains(page, `data-aggregate="acc-1"`) {
		t.Fatalf("status %d, page as the reconciler:\n%s", status, page)
	}
	f := url.Values{"csrf": {r.confirm("reconcile", nil)}, "operator": {"alice"}, "token": {consoleToken}}
	if status, _, body := r.post("reconcile", f); status != http.StatusSeeOther {
		t.Fatalf("reconcile as the reconciler: status %d:\n%s", status, body)
	}
	if n := r.count(false, `SELECT count(*) FROM console_audit WHERE action = 'reconcile' AND outcome = 'ok'`); n != 1 {
		t.Fatalf("%d audited reconciles", n)
	}
}

// In CDC mode the page shows the replication slot: its reader, WAL status,
// retained WAL and confirmed position, read as `outbox status` reads them.
func TestConsoleShowsTheCDCSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	t.Parallel()
	ctx := context.Background()
	_, ledgerURL, pool := pgtest.LogicalLedger(t, pgcluster.Options{}, 4)
	consumerURL, _ := pgtest.Consumer(t)
	cfg, err := configs.Load("", []string{"POSTHORN_DATABASE__URL=" + ledgerURL, "POSTHORN_CONSUMER__DATABASE__URL=" + consumerURL,
		"POSTHORN_RELAY__MODE=cdc"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, closeConsole, err := openConsole(ctx, cfg, pool, nil, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeConsole()
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	page := func() string {
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if p := page(); strings.Contains(p, `id="cdc"`) {
		t.Fatalf("a CDC section without a slot:\n%s", p)
	}
	if _, err := cdcsource.New(pool).CreateSlot(ctx, cfg.Relay.CDC.Slot); err != nil {
		t.Fatal(err)
	}
	p := page()
	for _, want := range []string{"CDC slot " + cfg.Relay.CDC.Slot, "no reader, wal_status reserved", "retained WAL", "confirmed position</dt><dd>0/", "<span>cdc</span>"} {
		if !strings.Contains(p, want) {
			t.Fatalf("page lacks %q:\n%s", want, p)
		}
	}
}

// The cleanup boundary on the page is cleanup --dry-run's: with the
// consumers' coverage recorded and the rows archived, it shows what
// `posthorn cleanup --dry-run --json` would delete.
func TestConsoleShowsTheCleanupBoundary(t *testing.T) {
	t.Parallel()
	r := newOpsCLIRig(t)
	r.postCovered(3)
	r.run("archive")
	var dry struct {
		ArchiveThrough int64           `json:"archive_through"`
		Plan           ops.CleanupPlan `json:"plan"`
	}
	if err := json.Unmarshal([]byte(r.run("cleanup", "--dry-run", "--json")), &dry); err != nil || dry.Plan.Rows == 0 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	cfg, err := configs.Load("", r.env, nil)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := openArchive(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, closeConsole, err := openConsole(context.Background(), cfg, r.ledger, nil, archive, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeConsole()
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(b)
	for _, want := range []string{
		fmt.Sprintf("archived through outbox id</dt><dd>%d</dd>", dry.ArchiveThrough),
		fmt.Sprintf("<dd>%d rows, outbox ids %d..%d;", dry.Plan.Rows, dry.Plan.FirstID, dry.Plan.LastID),
		"<td>balance-projection</td><td>", // coverage recorded by the clean reconcile
	} {
		if !strings.Contains(page, want) {
			t.Fatalf("page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "never reconciled clean") {
		t.Fatalf("page shows no coverage after a clean reconcile:\n%s", page)
	}
}

// startRigRelay starts a polling relay on ledger's outbox to sink, polling
// every poll; the function it returns stops it, once however often it is
// called.
func startRigRelay(t *testing.T, ctx context.Context, ledger *pgxpool.Pool, sink core.Sink, owner, sinkName string, poll time.Duration) (stop func()) {
	t.Helper()
	relay, err := polling.New(relaystore.New(ledger), sink, relay.Settings{Owner: owner, SinkName: sinkName, PollInterval: poll})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return sync.OnceFunc(func() {
		if err := relay.Stop(context.Background()); err != nil {
			t.Errorf("relay stop: %v", err)
		}
	})
}

// TestConsoleAndOutboxStatusShowAnUnacceptedHistory: after a failover the
// ledger runs on a history nobody accepted; the console's page and
// `outbox status` (text and JSON) say so, and say nothing while it is the
// accepted one.
func TestConsoleAndOutboxStatusShowAnUnacceptedHistory(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, "", memory.Config{})
	const banner = `id="ledger-history"`
	if _, page := r.get("/"); strings.Contains(page, banner) {
		t.Fatalf("the page warns of the accepted history:\n%s", page)
	}
	if out := r.run("outbox", "status"); !strings.Contains(out, "ledger history: system ") || !strings.Contains(out, "(accepted)") {
		t.Fatalf("outbox status on the accepted history:\n%s", out)
	}
	if _, err := r.ledger.Exec(context.Background(), `INSERT INTO posthorn.ledger_timelines (system_identifier, timeline, accepted_by, accepted_at)
SELECT system_identifier, timeline + 1, 'test', now() + interval '1 hour' FROM posthorn.ledger_history()`); err != nil {
		t.Fatal(err)
	}
	_, page := r.get("/")
	if !strings.Contains(page, banner) || !strings.Contains(page, "NOT the accepted history") {
		t.Fatalf("the page does not show the unaccepted history:\n%s", page)
	}
	out := r.run("outbox", "status")
	if !strings.Contains(out, "NOT the accepted history") || !strings.Contains(out, "posthorn failover recover") {
		t.Fatalf("outbox status on an unaccepted history:\n%s", out)
	}
	var st struct {
		History struct {
			Accepted bool  `json:"accepted"`
			Timeline int32 `json:"timeline"`
		} `json:"ledger_history"`
	}
	if err := json.Unmarshal([]byte(r.run("outbox", "status", "--json")), &st); err != nil || st.History.Accepted || st.History.Timeline == 0 {
		t.Fatalf("outbox status --json: %+v, %v", st, err)
	}
}
