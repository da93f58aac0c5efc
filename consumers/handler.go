package consumers

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/core"
)

// Handler applies one event or command. It must write its effect only
// through tx, which also carries the inbox row: both commit or neither.
// Return an error to retry (with backoff, then redelivery), or a Permanent
// one to park the event. Concurrency: a handler is called concurrently for
// different aggregates; for one aggregate of a DependsOnPredecessor
// consumer, calls are serialised by a row lock across all instances.
type Handler func(ctx context.Context, tx pgx.Tx, e core.Envelope) error

// BatchHandler applies a run of events in one transaction, which also
// carries their inbox rows. It must have exactly the effect of the
// consumer's Handler called for each event in the order given (for a
// DependsOnPredecessor consumer, an aggregate's events come in revision
// order), typically one set-based statement instead of one per event. It
// is an optimisation: on any error the transaction is rolled back and the
// events are applied again one by one with the Handler, which decides what
// is retried and what is poison.
type BatchHandler func(ctx context.Context, tx pgx.Tx, es []core.Envelope) error

// Permanent marks a handler error that retrying cannot fix (a payload the
// handler can never apply): the event is parked as parked_poison with the
// error as its reason instead of being retried. It is core.Permanent, named
// here for handler authors: one classifier, core.IsPermanent, decides
// retry versus park for sinks and handlers alike.
func Permanent(err error) error { return core.Permanent(err) }

// Option configures one registered handler.
type Option func(*handlerConfig)

// DependsOnPredecessor says the handler's effect depends on the previous
// revision of the aggregate (a running balance): revisions are applied
// strictly in order, gaps are held and then parked.
func DependsOnPredecessor() Option { return func(h *handlerConfig) { h.ordered = true } }

// WithHoldTime overrides Config.HoldTime for this handler.
func WithHoldTime(d time.Duration) Option { return func(h *handlerConfig) { h.hold = d } }

// WithSubscriber makes the handler read from sub instead of
// Config.Subscribers (e.g. a second instance on its own subscriber).
func WithSubscriber(sub message.Subscriber) Option {
	return func(h *handlerConfig) { h.subscriber = sub }
}

// WithBatchHandler gives the handler a set-based BatchHandler for the runs
// of events the inbox applies in one transaction.
func WithBatchHandler(h BatchHandler) Option { return func(c *handlerConfig) { c.batch = h } }

// WithoutInbox calls the handler in a plain transaction with no inbox row,
// no dedup and no gap check. It exists for negative controls in tests (it
// shows what the inbox prevents); do not use it in production.
func WithoutInbox() Option { return func(h *handlerConfig) { h.noInbox = true } }

type handlerConfig struct {
	consumer   string
	topic      string
	kind       core.Kind
	handler    Handler
	batch      BatchHandler
	ordered    bool
	hold       time.Duration
	noInbox    bool
	subscriber message.Subscriber

	handOff *handOff
	lanes   lanes
	metrics applyMetrics
	// firstApplied logs the first event applied (Registry.applied).
	firstApplied sync.Once
}
