package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// watchedPool opens a pool on url whose every connection reads the
// ledger's history first, as `posthorn relay` and `posthorn api` open theirs.
func watchedPool(t *testing.T, url string) (*pgxpool.Pool, *postgres.HistoryWatch) {
	t.Helper()
	cfg, err := postgres.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	w := postgres.NewHistoryWatch()
	w.Watch(cfg)
	pool, err := postgres.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w.Recheck(pool)
	return pool, w
}

// unacceptHistory makes the ledger's history one an operator has not
// accepted, as a promotion does: the last accepted history becomes a later
// timeline than the one the server writes on. The returned func accepts
// the server's history again (what posthorn failover recover ends with).
func unacceptHistory(t *testing.T, owner *pgxpool.Pool) (accept func()) {
	t.Helper()
	ctx := context.Background()
	if _, err := owner.Exec(ctx, `INSERT INTO posthorn.ledger_timelines (system_identifier, timeline, accepted_by, note, accepted_at)
SELECT system_identifier, timeline + 1, 'test', 'another history', now() + interval '1 hour' FROM posthorn.ledger_history()`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := owner.Exec(ctx, `DELETE FROM posthorn.ledger_timelines WHERE accepted_by = 'test'`); err != nil {
			t.Fatal(err)
		}
	}
}

// postOnce posts one transfer through the API handler and returns the
// status and body.
func postOnce(t *testing.T, url, key string) (int, string) {
	t.Helper()
	body := `{"entries":[{"account":"acc-h1","direction":"debit","amount":"5","currency":"EUR"},
{"account":"acc-h2","direction":"credit","amount":"5","currency":"EUR"}]}`
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/postings", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRelayAndAPIHoldOnAnUnacceptedHistory: while the ledger runs on a
// history an operator has not accepted (after a failover, until posthorn
// failover recover), the relay publishes nothing, says why at ERROR and in
// posthorn_relay_held_by_ledger_history, outbox status shows it, and the
// API answers 503 to postings and writes nothing; once the history is
// accepted both resume on their own. The control is a relay and an API
// without the check, on a second ledger in the same state: they publish
// and post on the unaccepted history.
func TestRelayAndAPIHoldOnAnUnacceptedHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type ledger struct {
		pool  *pgxpool.Pool
		watch *postgres.HistoryWatch
		sink  *memory.Sink
		reg   *prometheus.Registry
		srv   *httptest.Server
		// accept accepts the server's history again.
		accept func()
	}
	var log syncbuf.Buffer
	open := func(gated bool) *ledger {
		url, owner := pgtest.Ledger(t)
		if err := relaytest.Fill(ctx, owner, "h", 10, 3); err != nil {
			t.Fatal(err)
		}
		l := &ledger{sink: memory.New(memory.Config{}), reg: prometheus.NewRegistry(), accept: unacceptHistory(t, owner)}
		t.Cleanup(func() { _ = l.sink.Close() })
		l.pool, l.watch = watchedPool(t, url)
		cfg := relay.Settings{Owner: fmt.Sprintf("gated-%v", gated), SinkName: "memory", PollInterval: 50 * time.Millisecond,
			LeaseTTL: 5 * time.Second, Registerer: l.reg, Logger: slog.New(slog.NewTextHandler(&log, nil))}
		acfg := api.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}
		if gated {
			cfg.History, acfg.History = l.watch, l.watch
		}
		relaytest.Start(t, newRelay(t, l.pool, l.sink, cfg))
		srv, err := api.New(acfg, ledgerstore.New(l.pool, ledgerstore.Config{}))
		if err != nil {
			t.Fatal(err)
		}
		l.srv = httptest.NewServer(srv.Handler())
		t.Cleanup(l.srv.Close)
		return l
	}
	control := open(false)
	gated := open(true)

	// The control publishes the 30 waiting events and takes a posting.
	wait.For(t, 10*time.Second, "the control relay to publish on the unaccepted history", func() bool {
		return len(control.sink.Records(core.TopicEvents)) == 30
	})
	if code, body := postOnce(t, control.srv.URL, "k-1"); code != http.StatusCreated {
		t.Fatalf("control API: %d %s", code, body)
	}
	t.Logf("control (no history check): %d events published and a posting taken on the unaccepted history", len(control.sink.Records(core.TopicEvents)))

	// The gated relay holds, visibly; its API refuses and writes nothing.
	wait.For(t, 10*time.Second, "the gated relay to hold", func() bool {
		return promtest.Value(t, gated.reg, "posthorn_relay_held_by_ledger_history") == 1
	})
	if !strings.Contains(log.String(), "RELAY HOLDS BACK PUBLISHING") {
		t.Fatalf("no ERROR line says why the relay holds:\n%s", log.String())
	}
	code, body := postOnce(t, gated.srv.URL, "k-1")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "ledger-history-not-accepted") {
		t.Fatalf("gated API: %d %s, want 503 ledger-history-not-accepted", code, body)
	}
	var journals int64
	if err := gated.pool.QueryRow(ctx, `SELECT count(*) FROM journals`).Scan(&journals); err != nil || journals != 0 {
		t.Fatalf("the refused posting wrote %d journals (%v)", journals, err)
	}
	st, err := relaystore.New(gated.pool).Status(ctx)
	if err != nil || st.History == nil || st.History.Accepted || st.History.AcceptedTimeline != st.History.Timeline+1 {
		t.Fatalf("outbox status' history: %+v, %v", st.History, err)
	}
	if err := gated.watch.Check(ctx); !errors.Is(err, postgres.ErrHistoryNotAccepted) {
		t.Fatalf("the watch: %v", err)
	}
	time.Sleep(2 * time.Second) // several of the relay's polls
	if n := len(gated.sink.Records(core.TopicEvents)); n != 0 {
		t.Fatalf("the gated relay published %d events on the unaccepted history", n)
	}
	t.Logf("gated: 0 of 30 events published, the posting refused (%d journals), outbox status: %s", journals, st.History)

	// Accepting the history (what failover recover ends with) lets both go on.
	gated.accept()
	wait.For(t, 10*time.Second, "the gated relay to publish once the history is accepted", func() bool {
		return len(gated.sink.Records(core.TopicEvents)) == 30 && promtest.Value(t, gated.reg, "posthorn_relay_held_by_ledger_history") == 0
	})
	if code, body := postOnce(t, gated.srv.URL, "k-1"); code != http.StatusCreated {
		t.Fatalf("gated API after acceptance: %d %s", code, body)
	}
	// Every record names the timeline of the history its row was written on.
	for _, e := range relaytest.Delivered(t, gated.sink) {
		if e.LedgerTimeline != st.History.Timeline {
			t.Fatalf("record %s: ledger_timeline %d, want the server's %d", e.EventID, e.LedgerTimeline, st.History.Timeline)
		}
	}
	if !strings.Contains(log.String(), "publishing resumes") || !strings.Contains(log.String(), "postings are taken again") {
		t.Fatalf("no line says the relay and the API resumed:\n%s", log.String())
	}
}

// gauge reads one unlabelled series from the /metrics page at addr.
func gauge(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	t.Fatalf("%s not on %s/metrics", name, addr)
	return 0
}

// TestRelayAndAPIProcessesHoldOnAnUnacceptedHistory: `posthorn relay` and
// `posthorn api`, each under its own database role, read the ledger's
// history as those roles: they publish and post on the accepted one. When
// their sessions end (as a failover ends them) and the server's history is
// no longer the accepted one, the relay publishes nothing (its log says
// why, posthorn_relay_held_by_ledger_history is 1) and the API answers 503
// and writes nothing; once the history is accepted both go on by
// themselves.
func TestRelayAndAPIProcessesHoldOnAnUnacceptedHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := posthornBin(t)
	logDir := t.TempDir()
	ledgerURL, owner := roletest.Ledger(t)
	relayAddr, apiAddr := freeAddr(t), freeAddr(t)
	relay := faultkit.NewProc(faultkit.ProcConfig{Name: "relay", Bin: bin, Args: []string{"relay"}, LogDir: logDir,
		Env: []string{"POSTHORN_DATABASE__URL=" + roletest.Login(t, ledgerURL, postgres.RoleRelay, ""), "POSTHORN_SINK__KIND=memory",
			"POSTHORN_METRICS__LISTEN=" + relayAddr, "POSTHORN_RELAY__POLL_INTERVAL=100ms"},
		Ready: faultkit.HTTPReady("http://" + relayAddr + "/readyz")})
	apiProc := faultkit.NewProc(faultkit.ProcConfig{Name: "api", Bin: bin, Args: []string{"api"}, LogDir: logDir,
		Env:   []string{"POSTHORN_DATABASE__URL=" + roletest.Login(t, ledgerURL, postgres.RoleAPI, ""), "POSTHORN_API__LISTEN=" + apiAddr},
		Ready: faultkit.HTTPReady("http://" + apiAddr + "/readyz")})
	for _, p := range []*faultkit.Proc{relay, apiProc} {
		t.Cleanup(p.Close)
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	apiURL := "http://" + apiAddr
	if code, body := postOnce(t, apiURL, "p-1"); code != http.StatusCreated {
		t.Fatalf("a posting on the accepted history: %d %s", code, body)
	}
	wait.For(t, 30*time.Second, "the relay to publish on the accepted history", func() bool { return relaytest.Unrelayed(t, owner) == 0 })

	accept := unacceptHistory(t, owner)
	// A failover ends every session: end the components' own.
	if _, err := owner.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename LIKE 'posthorn_t_%' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	code, body := 0, ""
	wait.For(t, 30*time.Second, "the API to refuse postings", func() bool {
		code, body = postOnce(t, apiURL, "p-2")
		if code == http.StatusCreated {
			t.Fatalf("the API took a posting on the unaccepted history: %s", body)
		}
		return code == http.StatusServiceUnavailable
	})
	if !strings.Contains(body, "ledger-history-not-accepted") {
		t.Fatalf("503 body %s", body)
	}
	relaytest.MustPost(t, owner, "acc-h1", "acc-h2") // a row the relay must hold
	wait.For(t, 30*time.Second, "the relay to hold", func() bool {
		return gauge(t, relayAddr, "posthorn_relay_held_by_ledger_history") == 1
	})
	time.Sleep(time.Second) // ten of the relay's polls
	if n := relaytest.Unrelayed(t, owner); n == 0 {
		t.Fatal("the relay published on the unaccepted history")
	}
	if b, _ := os.ReadFile(relay.LogPath()); !strings.Contains(string(b), "RELAY HOLDS BACK PUBLISHING") {
		t.Fatalf("the relay's log does not say why it holds:\n%s", b)
	}
	if b, _ := os.ReadFile(apiProc.LogPath()); !strings.Contains(string(b), "API REFUSES POSTINGS") {
		t.Fatalf("the API's log does not say why it refuses:\n%s", b)
	}

	accept()
	wait.For(t, 30*time.Second, "the relay to publish once the history is accepted", func() bool {
		return relaytest.Unrelayed(t, owner) == 0 && gauge(t, relayAddr, "posthorn_relay_held_by_ledger_history") == 0
	})
	if code, body := postOnce(t, apiURL, "p-2"); code != http.StatusCreated {
		t.Fatalf("a posting once the history is accepted: %d %s", code, body)
	}
}

// TestFirstPostingAfterAFailoverIsRefused: the API's own check reads the
// history its pool saw last, and the first posting after a failover comes
// before any connection to the new primary has read the new one. The
// store checks again once the posting's connection is acquired (a new
// connection reads the history before it is handed out), so even that
// first posting is refused and writes nothing. The control is the API
// with its own check alone: the first posting after the sessions ended
// commits on the unaccepted history.
func TestFirstPostingAfterAFailoverIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, storeChecks := range []bool{true, false} {
		t.Run(fmt.Sprintf("store_checks=%v", storeChecks), func(t *testing.T) {
			url, owner := pgtest.Ledger(t)
			pool, watch := watchedPool(t, url)
			cfg := ledgerstore.Config{}
			if storeChecks {
				cfg.History = watch
			}
			srv, err := api.New(api.Config{Logger: slog.New(slog.DiscardHandler), History: watch}, ledgerstore.New(pool, cfg))
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewServer(srv.Handler())
			t.Cleanup(hs.Close)
			// The store wakes the relay after a commit with a NOTIFY on its
			// own pool, from a goroutine: one that ran only after the
			// pool's reset below would open a connection, read the new
			// history and refuse the control's posting at the API's check.
			// Its NOTIFY is awaited here.
			listener := pgtest.Listen(t, url, postgres.NotifyChannel)
			if code, body := postOnce(t, hs.URL, "first"); code != http.StatusCreated {
				t.Fatalf("before the failover: %d %s", code, body)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatalf("the store's wake-up after the first posting: %v", err)
			}
			listener.Close(ctx)
			unacceptHistory(t, owner)
			// A failover ends every session of the pool.
			if _, err := owner.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
				t.Fatal(err)
			}
			// The pool drops its dead connections (pgxpool would on its
			// next ping of each): the first posting reaches the store on a
			// new connection, which reads the new history before it is
			// handed out, after the API's own check read the old one. A
			// dead connection handed out first would fail the posting with
			// 500, and a client's retry would meet the API's check of the
			// history the new connection read: the control would then pass
			// or fail by timing, which it did on a loaded machine.
			pool.Reset()
			code, body := postOnce(t, hs.URL, "second")
			var journals int
			if err := owner.QueryRow(ctx, `SELECT count(*) FROM journals`).Scan(&journals); err != nil {
				t.Fatal(err)
			}
			t.Logf("store checks %v: the first posting after the failover answered %d, %d journals", storeChecks, code, journals)
			if storeChecks && (code != http.StatusServiceUnavailable || journals != 1) {
				t.Fatalf("the first posting after the failover: %d %s, %d journals; want 503 and nothing written", code, body, journals)
			}
			if !storeChecks && (code != http.StatusCreated || journals != 2) {
				t.Fatalf("control: the first posting after the failover: %d %s, %d journals; the API's own check alone should let it through", code, body, journals)
			}
		})
	}
}
