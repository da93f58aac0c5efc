package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	tokenA = "token-aaaaaaaaaaaaaaaa"
	tokenB = "token-bbbbbbbbbbbbbbbb"
)

type env struct {
	url  string
	pool *pgxpool.Pool
	logs *syncbuf.Buffer // written from handler goroutines
}

func newEnv(t *testing.T, tokens ...string) env {
	t.Helper()
	_, pool := pgtest.Ledger(t)
	logs := &syncbuf.Buffer{}
	srv, err := api.New(api.Config{Tokens: tokens, Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))},
		ledgerstore.New(pool, ledgerstore.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return env{url: ts.URL, pool: pool, logs: logs}
}

type request struct {
	method, path, body, key, contentType, auth string
	noKey                                      bool
}

type response struct {
	status  int
	header  http.Header
	body    []byte
	problem api.Problem
}

func (e env) do(t *testing.T, r request) response {
	t.Helper()
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/v1/postings"
	}
	req, err := http.NewRequest(r.method, e.url+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if r.method == http.MethodPost {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
		if !r.noKey {
			req.Header.Set("Idempotency-Key", r.key)
		}
	}
	if r.auth != "" {
		req.Header.Set("Authorization", r.auth)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := response{status: res.StatusCode, header: res.Header, body: body}
	if res.Header.Get("Content-Type") == "application/problem+json" {
		if err := json.Unmarshal(body, &out.problem); err != nil {
			t.Fatalf("problem body %q: %v", body, err)
		}
	}
	return out
}

// create does r, a posting, and fails t unless it was created (201).
func (e env) create(t *testing.T, r request) response {
	t.Helper()
	res := e.do(t, r)
	if res.status != http.StatusCreated {
		t.Fatalf("posting under key %q: %d %s, want 201", r.key, res.status, res.body)
	}
	return res
}

func entry(account, direction, amount, currency string) string {
	return fmt.Sprintf(`{"account":%q,"direction":%q,"amount":%q,"currency":%q}`, account, direction, amount, currency)
}

func body(entries ...string) string { return `{"entries":[` + strings.Join(entries, ",") + `]}` }

var validPosting = `{
  "entries": [
    {"account": "acc-alice", "direction": "debit",  "amount": "1250", "currency": "EUR"},
    {"account": "acc-bob",   "direction": "credit", "amount": "1250", "currency": "EUR"}
  ],
  "metadata": {"reference": "inv-2026-0042"},
  "commands": [{"type": "payouts.payout.execute", "payload": {"beneficiary": "acc-bob"}}]
}`

// Every bad request gets its documented status and a problem+json body
// whose detail and field name the culprit; none leaves a trace in the
// ledger, and the server still takes a valid posting afterwards.
func TestBadRequestsAreRefusedWithoutTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, tokenA, tokenB)
	bearer := "Bearer " + tokenA
	e.create(t, request{body: validPosting, key: "seed", auth: bearer})
	before := pgtest.LedgerState(t, e.pool)

	ok1, ok2 := entry("a", "debit", "5", "EUR"), entry("b", "credit", "5", "EUR")
	nines := strings.Repeat("9", 18)
	bigMeta := `{"entries":[` + ok1 + `,` + ok2 + `],"metadata":{"ref":"` + strings.Repeat("x", 100_000) + `"}}`
	many := make([]string, 0, 101)
	for i := 0; i < 101; i++ {
		many = append(many, entry(fmt.Sprintf("acc-%d", i), []string{"debit", "credit"}[i%2], "1", "EUR"))
	}
	tests := []struct {
		name   string
		req    request
		status int
		field  string
	}{
		{"malformed JSON", request{body: `{"entries": [`}, 400, "entries"},
		{"not JSON at all", request{body: `entries=1`}, 400, "body"},
		{"empty body", request{body: ``}, 400, "body"},
		{"body is an array", request{body: `[` + ok1 + `]`}, 400, "body"},
		{"unknown field", request{body: `{"entries":[` + ok1 + `,` + ok2 + `],"note":"x"}`}, 400, "note"},
		{"amount is a number", request{body: body(`{"account":"a","direction":"debit","amount":5,"currency":"EUR"}`, ok2)}, 400, "entries[0].amount"},
		{"entries is an object", request{body: `{"entries":{}}`}, 400, "entries"},
		{"missing entries", request{body: `{}`}, 400, "entries"},
		{"missing currency", request{body: body(ok1, `{"account":"b","direction":"credit","amount":"5"}`)}, 400, "entries[1].currency"},
		{"duplicate amount", request{body: body(`{"account":"a","direction":"debit","amount":"5","amount":"9","currency":"EUR"}`, ok2)}, 400, "entries[0].amount"},
		{"zero amount", request{body: body(entry("a", "debit", "0", "EUR"), entry("b", "credit", "0", "EUR"))}, 422, "entries[0].amount"},
		{"negative amount", request{body: body(entry("a", "debit", "-5", "EUR"), ok2)}, 422, "entries[0].amount"},
		{"fractional amount", request{body: body(entry("a", "debit", "5.5", "EUR"), ok2)}, 422, "entries[0].amount"},
		{"exponent amount", request{body: body(entry("a", "debit", "5e2", "EUR"), ok2)}, 422, "entries[0].amount"},
		{"over-long amount", request{body: body(entry("a", "debit", "1234567890123456789", "EUR"), ok2)}, 422, "entries[0].amount"},
		{"leading plus", request{body: body(entry("a", "debit", "+5", "EUR"), ok2)}, 422, "entries[0].amount"},
		{"int64 overflow in a sum", request{body: body(entry("a", "credit", nines, "EUR"), entry("b", "credit", nines, "EUR"), entry("c", "credit", nines, "EUR"),
			entry("d", "credit", nines, "EUR"), entry("e", "credit", nines, "EUR"), entry("f", "credit", nines, "EUR"), entry("g", "credit", nines, "EUR"),
			entry("h", "credit", nines, "EUR"), entry("i", "credit", nines, "EUR"), entry("j", "credit", nines, "EUR"), entry("k", "debit", "1", "EUR"))}, 422, "entries[9].amount"},
		{"unbalanced", request{body: body(ok1, entry("b", "credit", "4", "EUR"))}, 422, "entries"},
		{"mixed currencies", request{body: body(ok1, entry("b", "credit", "5", "USD"))}, 422, "entries"},
		{"bad currency", request{body: body(entry("a", "debit", "5", "EUX"), ok2)}, 422, "entries[0].currency"},
		{"lower-case currency", request{body: body(ok1, entry("b", "credit", "5", "eur"))}, 422, "entries[1].currency"},
		{"bad account", request{body: body(entry("a/b", "debit", "5", "EUR"), ok2)}, 422, "entries[0].account"},
		{"over-long account", request{body: body(entry(strings.Repeat("a", 65), "debit", "5", "EUR"), ok2)}, 422, "entries[0].account"},
		{"bad direction", request{body: body(entry("a", "out", "5", "EUR"), ok2)}, 422, "entries[0].direction"},
		{"one entry", request{body: body(ok1)}, 422, "entries"},
		{"too many entries", request{body: body(many...)}, 422, "entries"},
		{"huge metadata", request{body: bigMeta}, 422, `metadata["ref"]`},
		{"bad command type", request{body: `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[{"type":"payout"}]}`}, 422, "commands[0].type"},
		{"body over 1 MiB", request{body: `{"entries":[` + ok1 + `,` + ok2 + `],"metadata":{"x":"` + strings.Repeat("x", 1<<20) + `"}}`}, 413, "body"},
		{"wrong content type", request{body: validPosting, contentType: "text/plain"}, 415, "Content-Type"},
		{"form content type", request{body: validPosting, contentType: "application/x-www-form-urlencoded"}, 415, "Content-Type"},
		{"missing idempotency key", request{body: validPosting, noKey: true}, 400, "Idempotency-Key"},
		{"empty idempotency key", request{body: validPosting, key: ""}, 400, "Idempotency-Key"},
		{"over-long idempotency key", request{body: validPosting, key: strings.Repeat("k", 129)}, 400, "Idempotency-Key"},
		{"non-ASCII idempotency key", request{body: validPosting, key: "clé"}, 400, "Idempotency-Key"},
		{"missing token", request{body: validPosting, auth: "-"}, 401, "Authorization"},
		{"wrong token", request{body: validPosting, auth: "Bearer token-cccccccccccccccc"}, 401, "Authorization"},
		{"token prefix", request{body: validPosting, auth: "Bearer " + tokenA[:10]}, 401, "Authorization"},
		{"basic auth", request{body: validPosting, auth: "Basic " + tokenA}, 401, "Authorization"},
		{"reused key, other body", request{body: body(ok1, ok2), key: "seed"}, 409, "Idempotency-Key"},
		{"GET unknown posting", request{method: http.MethodGet, path: "/v1/postings/01900000-0000-7000-8000-000000000000"}, 404, "journal_id"},
		{"GET posting with a bad id", request{method: http.MethodGet, path: "/v1/postings/not-a-uuid"}, 400, "journal_id"},
		{"GET bad account", request{method: http.MethodGet, path: "/v1/accounts/-x"}, 400, "account"},
		{"GET unknown account", request{method: http.MethodGet, path: "/v1/accounts/nobody"}, 404, "account"},
		{"DELETE a posting", request{method: http.MethodDelete, path: "/v1/postings/01900000-0000-7000-8000-000000000000"}, 405, "method"},
		{"GET the postings collection", request{method: http.MethodGet, path: "/v1/postings"}, 405, "method"},
	}
	for i, tt := range tests {
		r := tt.req
		switch r.auth {
		case "":
			r.auth = bearer
		case "-":
			r.auth = ""
		}
		if r.key == "" && tt.name != "empty idempotency key" {
			r.key = fmt.Sprintf("bad-%d", i)
		}
		res := e.do(t, r)
		if res.status != tt.status {
			t.Errorf("%s: status %d, want %d (%s)", tt.name, res.status, tt.status, res.body)
			continue
		}
		p := res.problem
		if res.header.Get("Content-Type") != "application/problem+json" || p.Status != tt.status || p.Title == "" || !strings.HasPrefix(p.Type, api.ProblemTypePrefix) {
			t.Errorf("%s: not a problem+json answer: %s %s", tt.name, res.header.Get("Content-Type"), res.body)
			continue
		}
		if p.Field != tt.field || !strings.Contains(p.Detail, tt.field) {
			t.Errorf("%s: field %q, detail %q; want both to name %s", tt.name, p.Field, p.Detail, tt.field)
		}
	}
	if after := pgtest.LedgerState(t, e.pool); !maps.Equal(before, after) {
		t.Errorf("refused requests changed the ledger:\nbefore %v\nafter  %v", before, after)
	}
	e.create(t, request{body: body(ok1, ok2), key: "after-the-storm", auth: "Bearer " + tokenB})
	logs := e.logs.String()
	if strings.Contains(logs, tokenA) || strings.Contains(logs, tokenB) || strings.Contains(logs, tokenA[:10]) {
		t.Error("a bearer token appears in the logs")
	}
	if strings.Contains(logs, "AUTHENTICATION IS OFF") {
		t.Error("auth is on but the log says it is off")
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := e.create(t, request{body: validPosting, key: "k-1"})
	// Same key, same request (other formatting): the same answer, 200.
	again := e.do(t, request{body: strings.Join(strings.Fields(validPosting), ""), key: "k-1"})
	if again.status != http.StatusOK || !bytes.Equal(again.body, first.body) {
		t.Fatalf("repeat: %d %s, want 200 %s", again.status, again.body, first.body)
	}
	other := e.do(t, request{body: strings.Replace(validPosting, "1250", "1251", 2), key: "k-1"})
	if other.status != http.StatusConflict || other.problem.Field != "Idempotency-Key" {
		t.Fatalf("other body under the key: %d %s, want 409 naming Idempotency-Key", other.status, other.body)
	}

	// 20 concurrent requests with one fresh key: one journal, one 201, and
	// everyone gets the same answer.
	const n = 20
	results := make([]response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			results[i] = e.do(t, request{body: validPosting, key: "k-concurrent"})
		}(i)
	}
	close(start)
	wg.Wait()
	created := 0
	for i, r := range results {
		switch r.status {
		case http.StatusCreated:
			created++
		case http.StatusOK:
		default:
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		if !bytes.Equal(r.body, results[0].body) {
			t.Errorf("request %d got another answer:\n%s\n%s", i, r.body, results[0].body)
		}
	}
	if created != 1 {
		t.Errorf("%d requests got 201, want exactly 1", created)
	}
	var journals int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM journals j JOIN idempotency_keys k ON k.journal_id = j.id WHERE k.key = 'k-concurrent'`).Scan(&journals); err != nil {
		t.Fatal(err)
	}
	var total int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM journals`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if journals != 1 || total != 2 {
		t.Errorf("key k-concurrent has %d journals and the ledger %d, want 1 and 2", journals, total)
	}
	if !strings.Contains(e.logs.String(), "AUTHENTICATION IS OFF") {
		t.Error("with no tokens the API must say at start that authentication is off")
	}
}

func TestReadPostingAndAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	created := e.create(t, request{body: validPosting, key: "k"})
	var res struct {
		JournalID string `json:"journal_id"`
		Sequence  int64  `json:"sequence"`
		Events    []struct {
			EventID  string `json:"event_id"`
			Account  string `json:"account"`
			Revision int64  `json:"revision"`
		} `json:"events"`
		Commands []struct {
			EventID string `json:"event_id"`
			Type    string `json:"type"`
		} `json:"commands"`
	}
	if err := json.Unmarshal(created.body, &res); err != nil {
		t.Fatal(err)
	}
	if res.Sequence != 1 || len(res.Events) != 2 || res.Events[0].Account != "acc-alice" || res.Events[0].Revision != 1 ||
		len(res.Commands) != 1 || res.Commands[0].Type != "payouts.payout.execute" || created.header.Get("Location") != "/v1/postings/"+res.JournalID {
		t.Fatalf("201 body %s", created.body)
	}
	got := e.do(t, request{method: http.MethodGet, path: "/v1/postings/" + res.JournalID})
	var p struct {
		JournalID string `json:"journal_id"`
		Entries   []struct {
			Account  string `json:"account"`
			Amount   string `json:"amount"`
			EventID  string `json:"event_id"`
			Revision int64  `json:"revision"`
		} `json:"entries"`
		Metadata map[string]string `json:"metadata"`
		Commands []struct {
			EventID string          `json:"event_id"`
			Payload json.RawMessage `json:"payload"`
		} `json:"commands"`
	}
	if err := json.Unmarshal(got.body, &p); err != nil || got.status != http.StatusOK {
		t.Fatalf("GET posting: %d %s %v", got.status, got.body, err)
	}
	if p.JournalID != res.JournalID || len(p.Entries) != 2 || p.Entries[1].Account != "acc-bob" || p.Entries[1].Amount != "1250" ||
		p.Entries[1].EventID != res.Events[1].EventID || p.Metadata["reference"] != "inv-2026-0042" || len(p.Commands) != 1 ||
		p.Commands[0].EventID != res.Commands[0].EventID {
		t.Errorf("GET posting: %s", got.body)
	}
	for acc, want := range map[string]string{"acc-alice": `{"account":"acc-alice","balances":{"EUR":"-1250"},"revision":1}`, "acc-bob": `{"account":"acc-bob","balances":{"EUR":"1250"},"revision":1}`} {
		r := e.do(t, request{method: http.MethodGet, path: "/v1/accounts/" + acc})
		if r.status != http.StatusOK || strings.TrimSpace(string(r.body)) != want {
			t.Errorf("GET account %s: %d %s, want %s", acc, r.status, r.body, want)
		}
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := e.do(t, request{method: http.MethodGet, path: path}); r.status != http.StatusOK {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}
	}
	// A closed pool cannot answer: not ready, while still healthy.
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn, 2)
	pool.Close()
	srv, err := api.New(api.Config{Logger: slog.New(slog.DiscardHandler)}, ledgerstore.New(pool, ledgerstore.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with the database gone: %d, want 503", rec.Code)
	}
}

func TestServeStopsWhenContextIsCancelled(t *testing.T) {
	t.Parallel()
	ln, cancel, done := serve(t, api.Config{Logger: slog.New(slog.DiscardHandler)})
	res, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve after cancel: %v, want nil", err)
	}
	if _, err := http.Get("http://" + ln.Addr().String() + "/healthz"); err == nil {
		t.Error("still serving after shutdown")
	}
}

// serve starts a server with cfg on a fresh ledger and a free local port;
// cancel stops it and done then yields what Serve returned.
func serve(t *testing.T, cfg api.Config) (ln net.Listener, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	_, pool := pgtest.Ledger(t)
	srv, err := api.New(cfg, ledgerstore.New(pool, ledgerstore.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	return ln, cancel, served
}

// A retry of a key a ledger failover recovery recorded: restored, it
// answers 200 with the re-committed journal and writes nothing; lost, 409
// idempotency-key-lost-in-failover, naming the journal in the problem, and
// writes nothing. (The store's side, and its control, are in
// adapters/postgres/opsstore.)
func TestRetryOfAKeyALedgerFailoverRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	p, err := core.ParsePosting([]byte(validPosting))
	if err != nil {
		t.Fatal(err)
	}
	hash := core.PostingHash(p)
	var journal string
	if err := json.Unmarshal(e.create(t, request{body: validPosting, key: "k-orig"}).body, &struct {
		JournalID *string `json:"journal_id"`
	}{&journal}); err != nil {
		t.Fatal(err)
	}
	const lostJournal = "0193a5b0-0000-7000-8000-000000000001"
	if _, err := e.pool.Exec(ctx, `INSERT INTO posthorn.failover_keys (digest, journal_id, restored, reason, expires_at)
VALUES ($1, $2, true, '', now() + interval '1 hour'), ($3, $4, false, 'journal does not balance', now() + interval '1 hour')`,
		core.IdempotencyDigest("k-restored", hash), journal, core.IdempotencyDigest("k-lost", hash), lostJournal); err != nil {
		t.Fatal(err)
	}
	journals := func() int {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM journals`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := journals()
	restored := e.do(t, request{body: validPosting, key: "k-restored"})
	if restored.status != http.StatusOK || !strings.Contains(string(restored.body), journal) || restored.header.Get("Location") != "/v1/postings/"+journal {
		t.Fatalf("retry of a restored key: %d %s, want 200 with journal %s", restored.status, restored.body, journal)
	}
	lost := e.do(t, request{body: validPosting, key: "k-lost"})
	if lost.status != http.StatusConflict || lost.problem.Type != api.ProblemTypePrefix+"idempotency-key-lost-in-failover" ||
		lost.problem.JournalID != lostJournal || lost.problem.Field != "Idempotency-Key" || !strings.Contains(lost.problem.Detail, lostJournal) {
		t.Fatalf("retry of a lost key: %d %s, want 409 idempotency-key-lost-in-failover naming %s", lost.status, lost.body, lostJournal)
	}
	if n := journals(); n != before {
		t.Fatalf("the retries wrote %d journals", n-before)
	}
}
