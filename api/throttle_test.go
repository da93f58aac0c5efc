package api_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/internal/authguard"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
)

// 200 wrong tokens from one address: the first authguard.DefaultMax are
// refused (401) and logged without the token, then the address gets 429,
// the right token included, so guessing stops paying. Negative control:
// with throttling off the same 200 guesses all get their 401 and the
// right token, guessed last, gets in.
func TestTokenGuessingIsLoggedAndThrottled(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	guess := func(t *testing.T, maxFailures int) (statuses map[int]int, last int, logs string) {
		buf := &syncbuf.Buffer{}
		srv, err := api.New(api.Config{Tokens: []string{tokenA}, MaxTokenFailures: maxFailures,
			Logger: slog.New(slog.NewJSONHandler(buf, nil))}, ledgerstore.New(pool, ledgerstore.Config{}))
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(srv.Handler())
		defer ts.Close()
		e := env{url: ts.URL, pool: pool, logs: buf}
		statuses = map[int]int{}
		for i := range 200 {
			auth := "Bearer wrong-guess-" + strings.Repeat("x", i%7) + tokenB
			if i%50 == 0 {
				auth = "Basic d3Jvbmc6Z3Vlc3M=" // a malformed header counts too
			}
			statuses[e.do(t, request{method: http.MethodGet, path: "/v1/accounts/acc-x", auth: auth}).status]++
		}
		last = e.do(t, request{method: http.MethodGet, path: "/v1/accounts/acc-x", auth: "Bearer " + tokenA}).status
		return statuses, last, buf.String()
	}

	statuses, last, logs := guess(t, 0)
	if statuses[http.StatusUnauthorized] != authguard.DefaultMax || statuses[http.StatusTooManyRequests] != 200-authguard.DefaultMax {
		t.Fatalf("statuses %v, want %d×401 then 429", statuses, authguard.DefaultMax)
	}
	if last != http.StatusTooManyRequests {
		t.Fatalf("the right token from a throttled address: %d, want 429", last)
	}
	if n := strings.Count(logs, "Posting API refused a token"); n != authguard.DefaultMax {
		t.Errorf("%d refusal lines, want %d", n, authguard.DefaultMax)
	}
	if !strings.Contains(logs, "Posting API throttles an address") || !strings.Contains(logs, `"remote_addr":"127.0.0.1`) {
		t.Errorf("the throttling is not logged with the address:\n%s", logs)
	}
	if strings.Contains(logs, "wrong-guess") || strings.Contains(logs, tokenB) || strings.Contains(logs, tokenA) || strings.Contains(logs, "d3Jvbmc") {
		t.Fatalf("a presented token reached the log:\n%s", logs)
	}

	statuses, last, _ = guess(t, -1)
	if statuses[http.StatusUnauthorized] != 200 || last != http.StatusNotFound {
		t.Fatalf("negative control: with throttling off, statuses %v and the right token %d; want 200×401 and 404 (authenticated, no such account)", statuses, last)
	}
}
