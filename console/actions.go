package console

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/authguard"
	"github.com/posthorn/posthorn/ops"
)

// csrfCookie holds the page's CSRF token; every action form carries it
// back in the field csrf (double submit: a page of another origin can
// neither read the cookie nor guess the token).
const csrfCookie = "posthorn_console_csrf"

// fieldError is a refused request: which form field, why, and the HTTP
// status to answer with.
type fieldError struct {
	status int
	field  string
	msg    string
}

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

func refuse(status int, field, format string, args ...any) *fieldError {
	return &fieldError{status: status, field: field, msg: fmt.Sprintf(format, args...)}
}

func badInput(field, format string, args ...any) *fieldError {
	return refuse(http.StatusUnprocessableEntity, field, format, args...)
}

// action is one thing an operator may do: the same call its CLI command
// makes (cli names it), after check has refused bad input without
// changing anything.
type action struct {
	title string
	cli   string
	// fields are the form fields the confirmation carries, in order.
	fields []string
	// check validates the form and returns what the action is about, for
	// the confirmation and the audit log.
	check func(ctx context.Context, c *Console, f url.Values) (target string, err error)
	// run performs it for operator and says what it did.
	run func(ctx context.Context, c *Console, f url.Values, operator string) (detail string, err error)
}

// parkedOnRelay returns the aggregate the form names and its park on the
// relay, or an input error naming the field when it is not parked.
func (c *Console) parkedOnRelay(ctx context.Context, f url.Values) (core.AggregateKey, core.ParkedAggregate, error) {
	key, err := aggregateOf(f)
	if err != nil {
		return key, core.ParkedAggregate{}, err
	}
	st, err := c.cfg.Store.OutboxStatus(ctx)
	if err != nil {
		return key, core.ParkedAggregate{}, err
	}
	for _, p := range st.Parked {
		if p.Key() == key {
			return key, p, nil
		}
	}
	return key, core.ParkedAggregate{}, badInput("aggregate_id", "%s %q is not parked on the relay", key.Type, key.ID)
}

var actions = map[string]action{
	"release-relay": {
		title: "Release a parked aggregate on the relay", cli: "posthorn outbox release",
		fields: []string{"aggregate_type", "aggregate_id"},
		check: func(ctx context.Context, c *Console, f url.Values) (string, error) {
			key, _, err := c.parkedOnRelay(ctx, f)
			if err != nil {
				return "", err
			}
			return key.Type + " " + key.ID, nil
		},
		run: func(ctx context.Context, c *Console, f url.Values, _ string) (string, error) {
			key, _ := aggregateOf(f)
			if err := c.cfg.Store.ReleaseRelay(ctx, key.Type, key.ID); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s %s released; the relay sends its records again from the one that was parked", key.Type, key.ID), nil
		},
	},
	"dead-letter-relay": {
		title: "Dead-letter a parked record the sink can never take", cli: "posthorn outbox dead-letter",
		fields: []string{"aggregate_type", "aggregate_id", "event_id"},
		check: func(ctx context.Context, c *Console, f url.Values) (string, error) {
			key, p, err := c.parkedOnRelay(ctx, f)
			if err != nil {
				return "", err
			}
			if id := strings.TrimSpace(f.Get("event_id")); id != "" && id != p.EventID {
				return "", badInput("event_id", "%.80q is not the parked record of %s %q, which is %s", id, key.Type, key.ID, p.EventID)
			}
			return key.Type + " " + key.ID + " event " + p.EventID, nil
		},
		run: func(ctx context.Context, c *Console, f url.Values, operator string) (string, error) {
			key, _ := aggregateOf(f)
			return c.cfg.Store.DeadLetterRelay(ctx, key.Type, key.ID, strings.TrimSpace(f.Get("event_id")), operator)
		},
	},
	"release-consumer": {
		title: "Release a consumer's parked aggregate", cli: "posthorn consume release",
		fields: []string{"consumer", "aggregate_type", "aggregate_id"},
		check: func(ctx context.Context, c *Console, f url.Values) (string, error) {
			name := f.Get("consumer")
			if !c.knownConsumer(name) {
				return "", badInput("consumer", "%q is not one of the console's consumers %v", name, c.consumers)
			}
			key, err := aggregateOf(f)
			if err != nil {
				return "", err
			}
			st, err := c.cfg.Store.Consumer(ctx, name, 0)
			if err != nil {
				return "", err
			}
			for _, p := range st.Parked {
				if p.AggregateKey == key {
					return name + ": " + key.Type + " " + key.ID, nil
				}
			}
			return "", badInput("aggregate_id", "%s %q is not parked in consumer %s", key.Type, key.ID, name)
		},
		run: func(ctx context.Context, c *Console, f url.Values, _ string) (string, error) {
			key, _ := aggregateOf(f)
			n, err := c.cfg.Store.ReleaseConsumer(ctx, f.Get("consumer"), key.Type, key.ID)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("released %d event(s) of %s %s for consumer %s; a running consumer re-drives them in revision order",
				n, key.Type, key.ID, f.Get("consumer")), nil
		},
	},
	"resend": {
		title: "Resend an event by its event ID", cli: "posthorn outbox resend --event-id",
		fields: []string{"event_id"},
		check: func(ctx context.Context, c *Console, f url.Values) (string, error) {
			id := strings.TrimSpace(f.Get("event_id"))
			if id == "" {
				return "", badInput("event_id", "is required")
			}
			if _, err := uuid.Parse(id); err != nil {
				return "", badInput("event_id", "%.80q is not an event ID (a UUID)", id)
			}
			if c.cfg.Sink == nil {
				return "", badInput("event_id", "cannot be resent: the console has no sink configured (sink.kind)")
			}
			unknown, err := c.cfg.Ledger.UnknownEventIDs(ctx, []string{id})
			if err != nil {
				return "", err
			}
			if len(unknown) > 0 {
				return "", badInput("event_id", "%s is not in the outbox", id)
			}
			return id, nil
		},
		run: func(ctx context.Context, c *Console, f url.Values, _ string) (string, error) {
			res, err := ops.Resend(ctx, ops.ResendConfig{Ledger: c.cfg.Ledger, Sink: c.cfg.Sink,
				EventIDs: []string{strings.TrimSpace(f.Get("event_id"))}})
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("resent %d row(s) with their original event IDs; %d unrelayed row(s) got their marker after the ACK", res.Sent, res.Marked), nil
		},
	},
	"reconcile": {
		title: "Reconcile by cut", cli: "posthorn reconcile",
		check: func(_ context.Context, c *Console, _ url.Values) (string, error) {
			if len(c.cfg.Consumers) == 0 {
				return "", badInput("action", "no consumers to reconcile (reconcile.consumers)")
			}
			return "the last committed journal sequence", nil
		},
		run: func(ctx context.Context, c *Console, _ url.Values, _ string) (string, error) {
			rep, err := ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: c.cfg.Ledger, Consumers: c.cfg.Consumers,
				Archive: c.cfg.Archive, Record: true})
			run := &reconcileRun{At: time.Now(), Report: rep}
			if err != nil {
				run.Err = err.Error()
			}
			c.mu.Lock()
			c.lastRecon = run
			c.mu.Unlock()
			if err != nil {
				return "", err
			}
			if !rep.Clean {
				return fmt.Sprintf("cut at journal sequence %d: DISCREPANCIES", rep.Cut.Sequence), nil
			}
			return fmt.Sprintf("cut at journal sequence %d: clean; coverage recorded", rep.Cut.Sequence), nil
		},
	},
}

// aggregateOf reads aggregate_type (default account) and aggregate_id.
func aggregateOf(f url.Values) (core.AggregateKey, error) {
	typ, id := f.Get("aggregate_type"), strings.TrimSpace(f.Get("aggregate_id"))
	if typ == "" {
		typ = core.AggregateAccount
	}
	switch {
	case !core.ValidAggregateType(typ):
		return core.AggregateKey{}, badInput("aggregate_type", "is %.40q, want 1 to 64 letters, digits, '.', '_' or '-' (%s, %s, or a type your services publish)", typ, core.AggregateAccount, core.AggregateJournal)
	case id == "":
		return core.AggregateKey{}, badInput("aggregate_id", "is required")
	case len(id) > core.MaxAggregateIDLen:
		return core.AggregateKey{}, badInput("aggregate_id", "is %d bytes, want at most %d", len(id), core.MaxAggregateIDLen)
	case typ == core.AggregateAccount && !core.ValidAccountID(id):
		return core.AggregateKey{}, badInput("aggregate_id", "%.80q is not an account ID", id)
	}
	return core.AggregateKey{Type: typ, ID: id}, nil
}

// authorize checks, in this order, the CSRF token, that actions are on,
// that the address is not throttled, the action token and the operator's
// name: the request's own credentials before anything it asks for is
// read. It returns the operator's name for the audit log: the one whose
// token was presented (Config.Operators), or, with the shared
// console.token, the name typed in the form.
func (c *Console) authorize(r *http.Request, action string) (string, error) {
	cookie, err := r.Cookie(csrfCookie)
	form := r.PostForm.Get("csrf")
	switch {
	case form == "":
		return "", refuse(http.StatusForbidden, "csrf", "missing: submit the action from the console's own confirmation page")
	case err != nil || subtle.ConstantTimeCompare([]byte(cookie.Value), []byte(form)) != 1:
		return "", refuse(http.StatusForbidden, "csrf", "does not match this browser's console page; reload the page and confirm again")
	case c.ReadOnly():
		return "", refuse(http.StatusForbidden, "token", "the console is read-only: neither console.token nor console.operators is set")
	}
	addr := authguard.Host(r.RemoteAddr)
	if left, blocked := c.guard.Blocked(addr); blocked {
		return "", refuse(http.StatusTooManyRequests, "token", "too many refused tokens from this address; try again in %d s", int(left.Seconds())+1)
	}
	token := r.PostForm.Get("token")
	if token == "" {
		c.tokenFailed(r, addr, action, "no token")
		return "", refuse(http.StatusUnauthorized, "token", "is required for actions (your operator token, or console.token)")
	}
	if i := c.opTokens.Index(token); i >= 0 {
		return c.opNames[i], nil
	}
	if c.tokens.Len() == 0 || !c.tokens.Match(token) {
		c.tokenFailed(r, addr, action, "token not accepted")
		return "", refuse(http.StatusUnauthorized, "token", "is not accepted")
	}
	op := strings.TrimSpace(r.PostForm.Get("operator"))
	if !validOperator(op) {
		return "", badInput("operator", "is required with the shared console.token: your name for the audit log (at most 64 printable characters)")
	}
	return op, nil
}

// tokenFailed counts and logs a refused token: the address and action,
// never what was presented.
func (c *Console) tokenFailed(r *http.Request, addr, action, why string) {
	n, blocked := c.guard.Failed(addr)
	c.log.Warn("console refused a token", "remote_addr", r.RemoteAddr, "action", action, "reason", why, "failures", n)
	if blocked {
		c.log.Warn("console throttles an address for refused tokens: 429 to its actions for the window",
			"remote_addr", addr, "failures", n, "window", authguard.DefaultWindow.String())
	}
}

// handleAction runs one action: authorize, check the input, record the
// audit entry, run it, record its outcome, and send the browser back to
// the page with what happened. A refusal answers the confirmation page
// again with the error, having changed nothing.
func (c *Console) handleAction(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("action")
	a, ok := actions[name]
	if !ok {
		http.Error(w, fmt.Sprintf("action: unknown action %.40q", name), http.StatusNotFound)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "form: cannot be read", http.StatusBadRequest)
		return
	}
	fail := func(err error) {
		var fe *fieldError
		status := http.StatusInternalServerError
		if errors.As(err, &fe) {
			status = fe.status
		}
		c.renderConfirm(w, r, name, a, r.PostForm, status, err.Error())
	}
	operator, err := c.authorize(r, name)
	if err != nil {
		fail(err)
		return
	}
	c.actionMu.Lock()
	defer c.actionMu.Unlock()
	ctx := r.Context()
	target, err := a.check(ctx, c, r.PostForm)
	if err != nil {
		fail(err)
		return
	}
	entry := AuditEntry{Operator: operator, RemoteAddr: r.RemoteAddr, Action: name, Target: target}
	id, err := c.cfg.Store.BeginAudit(ctx, entry)
	if err != nil {
		fail(fmt.Errorf("not run: the audit log cannot be written: %w", err))
		return
	}
	detail, runErr := a.run(ctx, c, r.PostForm, operator)
	outcome := OutcomeOK
	if runErr != nil {
		outcome, detail = OutcomeFailed, runErr.Error()
	}
	// The outcome is recorded even when the browser went away meanwhile.
	if err := c.cfg.Store.FinishAudit(context.WithoutCancel(ctx), id, outcome, detail); err != nil {
		c.log.Error("console: recording an action's outcome failed", "audit_id", id, "action", name, "err", err)
	}
	c.log.Info("console action", "audit_id", id, "action", name, "target", target, "operator", entry.Operator,
		"remote_addr", entry.RemoteAddr, "outcome", outcome)
	if runErr != nil {
		fail(fmt.Errorf("%s failed: %w", a.cli, runErr))
		return
	}
	// The page shows the outcome from the audit log: a link cannot make it
	// say anything else.
	http.Redirect(w, r, fmt.Sprintf("/?done=%d", id), http.StatusSeeOther)
}
