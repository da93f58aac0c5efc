package main

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/posthorn/posthorn/adapters/memory"
)

// actionMarkup is what leads to an action: on the page a confirmation link
// or form, in its live part (the parked rows) a link.
var actionMarkup = map[string][]string{"/": {`href="/confirm?`, `action="/confirm"`}, "/live": {`href="/confirm?`}}

// A read-only console shows the parked rows but no action: no Release
// link, no Resend or Reconcile form, on the page and in its live part.
// The control is the same page of a console with a token, which has them.
func TestConsoleReadOnlyShowsNoActions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		token   string
		actions bool
	}{{"", false}, {consoleToken, true}} {
		r := newConsoleRig(t, tc.token, memory.Config{})
		r.parkBoth()
		for _, path := range []string{"/", "/live"} {
			_, body := r.get(path)
			if !strings.Contains(body, `data-aggregate="acc-2"`) || !strings.Contains(body, `data-aggregate="acc-1"`) {
				t.Fatalf("token %t, %s: the parked rows are missing:\n%s", tc.token != "", path, body)
			}
			for _, m := range actionMarkup[path] {
				if strings.Contains(body, m) != tc.actions {
					t.Errorf("token %t, %s: has %s = %t, want %t", tc.token != "", path, m, !tc.actions, tc.actions)
				}
			}
		}
	}
}

// In a browser: a read-only console shows no action button, and each
// plot's legend shows the latest sample's values without hovering. The
// control draws the same data in a uPlot without the console's legend
// hook, whose legend reads "--".
func TestConsoleBrowserReadOnlyAndLegends(t *testing.T) {
	t.Parallel()
	bctx, problems := browser(t)
	r := newConsoleRig(t, "", memory.Config{})
	r.parkBoth()
	if err := chromedp.Do(bctx, chromedp.Navigate(r.url+"/"), chromedp.WaitVisible(chromedp.CSS("#plot-lag canvas"))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, bctx, 20*time.Second, "two drawn updates", `posthornConsole.updates >= 2`)
	if n := evalJS[int](t, bctx, `document.querySelectorAll('a.button, #forms form, #forms button').length`); n != 0 {
		t.Errorf("the read-only page shows %d action buttons or forms", n)
	}
	if !evalJS[bool](t, bctx, `!!document.querySelector('#parked-relay tr[data-aggregate="acc-2"]')`) {
		t.Error("the parked row is not shown")
	}
	legends := evalJS[[]string](t, bctx, `Array.from(document.querySelectorAll('.plot .u-legend .u-series:not(:first-child) .u-value')).map(e => e.textContent)`)
	if len(legends) == 0 {
		t.Fatal("no legend values on the page")
	}
	for _, v := range legends {
		if v == "--" || v == "" {
			t.Errorf("a legend reads %q without hovering: %q", v, legends)
		}
	}
	t.Logf("legend values without hovering: %q", legends)
	control := evalJS[[]string](t, bctx, `(() => {
		const c = posthornConsole.charts.backlog, el = document.createElement("div");
		document.body.appendChild(el);
		const u = new uPlot({width: 400, height: 100, series: [{}, {label: "b"}], scales: {x: {time: true}}, legend: {live: true}},
			[c.data[0], c.data[1]], el);
		const v = Array.from(el.querySelectorAll('.u-legend .u-series:not(:first-child) .u-value')).map(e => e.textContent);
		u.destroy(); el.remove();
		return v;
	})()`)
	if len(control) != 1 || control[0] != "--" {
		t.Errorf("control: a legend without the hook reads %q, want [--]", control)
	}
	if p := problems(); len(p) > 0 {
		t.Fatalf("the browser reported:\n%s", strings.Join(p, "\n"))
	}
}
