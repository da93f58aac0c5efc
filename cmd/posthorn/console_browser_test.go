package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// chromiumPath is Debian's chromium, which .ci/run installs.
const chromiumPath = "/usr/bin/chromium"

// browser starts a headless chromium for the test and returns its context;
// problems returns every console error or warning, uncaught exception and
// browser log error (a failed load included) the page has written.
func browser(t *testing.T) (ctx context.Context, problems func() []string) {
	t.Helper()
	if _, err := exec.LookPath(chromiumPath); err != nil {
		msg := "chromium is not installed, so the console was NOT tested in a browser. Install it: apt-get install -y chromium"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip("\n*****\nSKIPPED: " + msg + "\n*****")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath),
		chromedp.NoSandbox, chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	var (
		mu   sync.Mutex
		seen []string
		wg   sync.WaitGroup
	)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc(); wg.Wait() })
	messages := chromedp.Console(bctx)
	wg.Go(func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			switch m.Type {
			case "error", "warning", chromedp.ConsoleException:
				mu.Lock()
				seen = append(seen, m.String()+" ("+m.URL+")")
				mu.Unlock()
			}
		}
	})
	return bctx, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), seen...) }
}

// evalJS evaluates js in the page and returns its value.
func evalJS[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// waitJS polls js until it is true and returns how long that took.
func waitJS(t *testing.T, ctx context.Context, d time.Duration, what, js string) time.Duration {
	t.Helper()
	start := time.Now()
	wait.For(t, d, what+" ("+js+")", func() bool { return evalJS[bool](t, ctx, js) })
	return time.Since(start)
}

// The console in a real browser while postings flow through a running
// relay and the example consumers: the page loads without console errors,
// the plots draw and move, an account the relay parks shows up within
// seconds, releasing it without the token is refused and with the token
// releases it and its row goes. Screenshots go to the test's artifact
// directory (go test -artifacts -outputdir DIR keeps them).
func TestConsoleBrowser(t *testing.T) {
	t.Parallel()
	bctx, problems := browser(t)
	// Records over 4 KiB are rejected for good: the relay parks their account.
	r := newConsoleRig(t, consoleToken, memory.Config{MaxPayloadBytes: 4096})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	stopRelay := startRigRelay(t, ctx, r.ledger, r.sink, "console-browser-test", "memory", 50*time.Millisecond)
	defer stopRelay()
	cfg, err := configs.Load("", r.env, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() {
		if err := runConsumers(ctx, cfg, consumeOptions{memory: r.sink.Subscriber(), log: slog.New(slog.DiscardHandler)}); err != nil {
			t.Errorf("consumers: %v", err)
		}
	})
	wg.Go(func() { r.flow(ctx) })

	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(t.ArtifactDir(), name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The page and its plots.
	if err := chromedp.Do(bctx, chromedp.Navigate(r.url+"/"), chromedp.WaitVisible(chromedp.CSS("#plot-rates canvas"))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, bctx, 20*time.Second, "two drawn updates with a publish rate above 0",
		`posthornConsole.updates >= 2 && posthornConsole.charts.rates.data[1].some(v => v > 0)`)
	points1 := evalJS[int](t, bctx, `posthornConsole.points`)
	canvas1 := evalJS[string](t, bctx, `document.querySelector("#plot-rates canvas").toDataURL()`)
	waitJS(t, bctx, 20*time.Second, "more samples drawn", fmt.Sprintf(`posthornConsole.points > %d + 1`, points1))
	if canvas1 == evalJS[string](t, bctx, `document.querySelector("#plot-rates canvas").toDataURL()`) {
		t.Fatal("the rates plot did not change while postings flowed")
	}
	if !evalJS[bool](t, bctx, `posthornConsole.charts.rates.data.slice(2).every(s => s.some(v => v > 0))`) {
		t.Fatal("a consumer's applied rate was never above 0")
	}
	shot("console.png")
	if p := problems(); len(p) > 0 {
		t.Fatalf("the browser reported while the page loaded and plotted:\n%s", strings.Join(p, "\n"))
	}

	// The relay parks acc-park; the page shows it within seconds.
	if err := pgx.BeginFunc(ctx, r.ledger, func(tx pgx.Tx) error {
		rev, err := relaytest.Lock(ctx, tx, "acc-park")
		if err != nil {
			return err
		}
		_, err = relaytest.Insert(ctx, tx, "acc-park", rev, fmt.Appendf(nil, `{"pad":%q}`, strings.Repeat("x", 8192)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	took := waitJS(t, bctx, 10*time.Second, "the parked row", `!!document.querySelector('#parked-relay tr[data-aggregate="acc-park"]')`)
	t.Logf("the parked account appeared on the page %s after its event was committed", took.Round(10*time.Millisecond))
	shot("console-parked.png")
	if n := r.count(false, `SELECT count(*) FROM relay_parked WHERE aggregate_id = 'acc-park'`); n != 1 {
		t.Fatalf("relay_parked has %d rows of acc-park", n)
	}

	// Release without the token: refused, still parked. The relay stops
	// first, so the release below is not undone by the sink rejecting the
	// same record again.
	stopRelay()
	if err := chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`#parked-relay tr[data-aggregate="acc-park"] a.release`)),
		chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.SetValue(chromedp.CSS(`input[name="operator"]`), "alice"),
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS(".error")),
	); err != nil {
		t.Fatal(err)
	}
	refusal := evalJS[string](t, bctx, `document.querySelector(".error").textContent`)
	if !strings.Contains(refusal, "token: is required") {
		t.Fatalf("refusal without the token: %q", refusal)
	}
	shot("console-refused.png")
	if n := r.count(false, `SELECT count(*) FROM relay_parked WHERE aggregate_id = 'acc-park'`); n != 1 {
		t.Fatal("acc-park was released without the token")
	}

	// With the token: released, and the row is gone.
	if err := chromedp.Do(bctx,
		chromedp.SetValue(chromedp.CSS(`input[name="token"]`), consoleToken),
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS(".done")),
	); err != nil {
		t.Fatal(err)
	}
	done := evalJS[string](t, bctx, `document.querySelector(".done").textContent`)
	rowGone := evalJS[bool](t, bctx, `!document.querySelector('tr[data-aggregate="acc-park"]')`)
	if !strings.Contains(done, "account acc-park released") || !rowGone {
		t.Fatalf("after the release: %q, row gone %v", done, rowGone)
	}
	if n := r.count(false, `SELECT count(*) FROM relay_parked`); n != 0 {
		t.Fatal("relay_parked still has rows after the release")
	}
	shot("console-released.png")
	// The one error is the refusal's answer: 401 on the action's URL.
	if p := problems(); len(p) != 1 || !strings.Contains(p[0], "401") || !strings.Contains(p[0], "/action/release-relay") {
		t.Fatalf("the browser reported, besides the refusal's 401:\n%s", strings.Join(p, "\n"))
	}
}

// flow posts a transfer between acc-0..acc-5 every 20ms until ctx ends.
func (r *consoleRig) flow(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		p := core.Posting{Entries: []core.Entry{
			{Account: fmt.Sprintf("acc-%d", i%6), Direction: core.Debit, Amount: 5, Currency: "EUR"},
			{Account: fmt.Sprintf("acc-%d", (i+1)%6), Direction: core.Credit, Amount: 5, Currency: "EUR"},
		}}
		if _, _, err := r.store.Post(ctx, fmt.Sprintf("flow-%d", i), p); err != nil && ctx.Err() == nil {
			r.t.Errorf("post: %v", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}
