package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/units"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay/cdc"
)

// eventIDsShown is how many waiting event IDs a parked row lists.
const eventIDsShown = 5

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"ago":  func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
	"when": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"secs": func(s float64) string {
		return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
	},
	"rate": func(r *float64) string {
		if r == nil {
			return "–"
		}
		return fmt.Sprintf("%.1f/s", *r)
	},
	"bytes": units.ByteSize,
	"confirm": func(action string, kv ...string) string {
		q := url.Values{"action": {action}}
		for i := 0; i+1 < len(kv); i += 2 {
			q.Set(kv[i], kv[i+1])
		}
		return "/confirm?" + q.Encode()
	},
}).ParseFS(templateFS, "templates/*.html"))

// boundary is the cleanup boundary: what the archive and the consumers'
// recorded coverage allow cleanup to delete, from `posthorn cleanup
// --dry-run`'s own code.
type boundary struct {
	At             time.Time
	ArchiveThrough int64
	Cleaned        ops.CleanupState
	DryRun         ops.CleanupResult
	// Refused is cleanup's reason for deleting nothing; Err a failed read.
	Refused, Err string
}

// consumerView is one consumer's row on the page.
type consumerView struct {
	ConsumerStatus
	Applied     int64
	AppliedRate *float64
	Lag         float64
	Coverage    *ops.Coverage
}

// pageData is everything the page shows, read fresh for each request.
type pageData struct {
	Now       time.Time
	ReadOnly  bool
	RelayMode string
	// Done is the action the operator was just sent back from.
	Done        *AuditEntry
	Outbox      core.OutboxStatus
	WriteRate   *float64
	PublishRate *float64
	Consumers   []consumerView
	Slot        *cdc.SlotStatus
	Boundary    boundary
	Recon       *reconcileRun
	Audit       []AuditEntry
	// Errors are reads that failed; the rest of the page still shows.
	Errors []string
}

func (c *Console) pageData(ctx context.Context) pageData {
	d := pageData{Now: time.Now(), ReadOnly: c.ReadOnly(), RelayMode: c.cfg.RelayMode}
	note := func(what string, err error) bool {
		if err != nil {
			d.Errors = append(d.Errors, what+": "+err.Error())
		}
		return err == nil
	}
	var err error
	d.Outbox, err = c.cfg.Store.OutboxStatus(ctx)
	note("outbox status", err)
	d.Slot, err = c.cfg.Store.Slot(ctx)
	note("CDC slot", err)
	cov, err := c.cfg.Ledger.Coverages(ctx)
	note("recorded coverage", err)
	s := c.series()
	last := len(s.Time) - 1
	if last >= 0 {
		d.WriteRate, d.PublishRate = s.WriteRate[last], s.PublishRate[last]
	}
	for i, name := range c.consumers {
		st, err := c.cfg.Store.Consumer(ctx, name, eventIDsShown)
		if !note("consumer "+name, err) {
			continue
		}
		v := consumerView{ConsumerStatus: st, Applied: st.Events[core.DispositionApplied]}
		if co, ok := cov[name]; ok {
			v.Coverage = &co
		}
		if last >= 0 {
			v.AppliedRate, v.Lag = s.AppliedRate[i][last], s.Lag[i][last]
		}
		d.Consumers = append(d.Consumers, v)
	}
	d.Boundary = c.cleanupBoundary(ctx)
	d.Audit, err = c.cfg.Store.Audit(ctx, 20)
	note("audit log", err)
	c.mu.Lock()
	d.Recon = c.lastRecon
	c.mu.Unlock()
	return d
}

// cleanupBoundary runs cleanup's dry run at most every BoundaryEvery: it
// re-verifies the archive segments it would delete behind, which is too
// much for every refresh.
func (c *Console) cleanupBoundary(ctx context.Context) boundary {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.boundaryAt.IsZero() && time.Since(c.boundaryAt) < c.cfg.BoundaryEvery {
		return c.boundary
	}
	b := boundary{At: time.Now()}
	var err error
	if b.ArchiveThrough, err = c.cfg.Ledger.ArchiveThrough(ctx); err == nil {
		b.Cleaned, err = c.cfg.Ledger.Cleaned(ctx)
	}
	if err == nil {
		b.DryRun, err = ops.Cleanup(ctx, ops.CleanupConfig{Ledger: c.cfg.Ledger, Archive: c.cfg.Archive,
			Required: c.cfg.Required, ReplayWindow: c.cfg.ReplayWindow, DryRun: true})
		if errors.Is(err, ops.ErrCleanupRefused) {
			b.Refused, err = err.Error(), nil
		}
	}
	if err != nil {
		b.Err = err.Error()
	}
	c.boundary, c.boundaryAt = b, b.At
	return b
}

// csrfToken returns the browser's CSRF token, setting a new one when it
// has none.
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= 16 {
		return ck.Value
	}
	t := newCSRFToken()
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return t
}

func (c *Console) handlePage(w http.ResponseWriter, r *http.Request) {
	d := c.pageData(r.Context())
	if id, err := strconv.ParseInt(r.URL.Query().Get("done"), 10, 64); err == nil {
		for _, e := range d.Audit {
			if e.ID == id {
				d.Done = &e
			}
		}
	}
	c.render(w, "page.html", http.StatusOK, d)
}

// handleLive is the page's live section alone, which the script swaps in
// every few seconds; without JavaScript the page refreshes itself.
func (c *Console) handleLive(w http.ResponseWriter, r *http.Request) {
	c.render(w, "live", http.StatusOK, c.pageData(r.Context()))
}

func (c *Console) handleSamples(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(c.series())
}

// confirmData is the confirmation page of one action.
type confirmData struct {
	Action   string
	Title    string
	CLI      string
	Target   string
	Fields   []confirmField
	Operator string
	CSRF     string
	ReadOnly bool
	// Shared is whether the shared console.token is on, whose holder types
	// their name; Named whether per-operator tokens name the operator.
	Shared, Named bool
	Error         string
}

type confirmField struct{ Name, Value string }

func (c *Console) handleConfirm(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("action")
	a, ok := actions[name]
	if !ok {
		http.Error(w, "action: unknown action", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	status, msg := http.StatusOK, ""
	if _, err := a.check(r.Context(), c, q); err != nil {
		// Shown before anything is asked of the operator; the action's
		// POST checks again.
		var fe *fieldError
		status = http.StatusInternalServerError
		if errors.As(err, &fe) {
			status = fe.status
		}
		msg = err.Error()
	}
	c.renderConfirm(w, r, name, a, q, status, msg)
}

func (c *Console) renderConfirm(w http.ResponseWriter, r *http.Request, name string, a action, f url.Values, status int, msg string) {
	d := confirmData{Action: name, Title: a.title, CLI: a.cli, Operator: f.Get("operator"),
		CSRF: csrfToken(w, r), ReadOnly: c.ReadOnly(), Shared: c.tokens.Len() > 0, Named: c.NamesOperators(), Error: msg}
	for _, k := range a.fields {
		d.Fields = append(d.Fields, confirmField{k, f.Get(k)})
	}
	if i := slices.IndexFunc(d.Fields, func(f confirmField) bool { return f.Name == "aggregate_type" }); i >= 0 && d.Fields[i].Value == "" {
		d.Fields[i].Value = core.AggregateAccount
	}
	c.render(w, "confirm.html", status, d)
}

func (c *Console) render(w http.ResponseWriter, name string, status int, data any) {
	var b strings.Builder
	if err := templates.ExecuteTemplate(&b, name, data); err != nil {
		c.log.Error("console: rendering failed", "template", name, "err", err)
		http.Error(w, "rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}
