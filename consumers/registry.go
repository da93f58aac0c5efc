package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

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

// ErrPermanent marks a handler failure that retrying cannot fix.
var ErrPermanent = errors.New("permanent handler failure")

// Permanent marks a handler error that retrying cannot fix (a payload the
// handler can never apply): the event is parked as parked_poison with the
// error as its reason instead of being retried.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

// IsPermanent reports an error marked by Permanent or by core.Permanent:
// either parks the event.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) || core.IsPermanent(err) }

// SubscriberFactory returns the subscriber a consumer reads with. It is
// called once per registered handler with the consumer's name, so brokers
// with consumer groups (Kafka) give each consumer its own group. The
// registry owns what it returns and closes it when Run ends.
type SubscriberFactory func(consumer string) (message.Subscriber, error)

// Defaults of Config.
const (
	DefaultHoldTime        = 30 * time.Second
	DefaultMaxRetries      = 5
	DefaultInitialInterval = 50 * time.Millisecond
	DefaultMaxInterval     = 2 * time.Second
	DefaultMaxBatch        = 512
)

// TxBeginner starts a transaction on the consumers' database; a
// *pgxpool.Pool is one.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures a Registry.
type Config struct {
	// Pool is the consumers' own database (a *pgxpool.Pool migrated with
	// adapters/postgres.ConsumerSchema): WithoutInbox handlers run in plain
	// transactions on it. Required.
	Pool TxBeginner
	// Inbox is the store on Pool that records every delivery
	// (adapters/postgres.NewInbox). Required.
	Inbox Inbox
	// Subscribers gives each consumer its subscriber. Required unless every
	// handler is registered WithSubscriber.
	Subscribers SubscriberFactory
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger for parks, rejections, poison and retries; nil discards.
	Logger *slog.Logger
	// HoldTime is how long an event received ahead of its predecessor is
	// held before its aggregate is parked (default DefaultHoldTime).
	HoldTime time.Duration
	// SweepInterval is how often each consumer re-drives held events and
	// parks expired holds (default HoldTime/10, within 10ms..1s).
	SweepInterval time.Duration
	// Retry configures the retries of a failing handler; zero fields take
	// the Default… values. Its ShouldRetry is replaced: permanent errors
	// never reach it (they park).
	Retry middleware.Retry
	// CommandTopicPrefix is the prefix of command topics (default
	// core.CommandTopicPrefix).
	CommandTopicPrefix string
	// MaxBatch bounds how many deliveries the inbox applies in one
	// transaction (default DefaultMaxBatch); 1 gives every delivery a
	// transaction of its own, as before batching (the benchmark's
	// baseline).
	MaxBatch int
	// TracerProvider, when set, gives every delivery an apply span that
	// continues the record's traceparent (trace.go); nil is tracing off.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HoldTime <= 0 {
		c.HoldTime = DefaultHoldTime
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = min(max(c.HoldTime/10, 10*time.Millisecond), time.Second)
	}
	if c.Retry.MaxRetries == 0 {
		c.Retry.MaxRetries = DefaultMaxRetries
	}
	if c.Retry.InitialInterval == 0 {
		c.Retry.InitialInterval = DefaultInitialInterval
	}
	if c.Retry.MaxInterval == 0 {
		c.Retry.MaxInterval = DefaultMaxInterval
	}
	if c.Retry.Multiplier == 0 {
		c.Retry.Multiplier = 2
	}
	if c.CommandTopicPrefix == "" {
		c.CommandTopicPrefix = core.CommandTopicPrefix
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = DefaultMaxBatch
	}
}

// Errors of registration.
var (
	// ErrCommandOwned: a command topic already has its one owner.
	ErrCommandOwned = errors.New("command topic already has an owner")
	// ErrWrongTopic: an event handler on a command topic or the reverse.
	ErrWrongTopic = errors.New("topic does not carry this kind")
	// ErrDuplicateHandler: the consumer is already registered on the topic.
	ErrDuplicateHandler = errors.New("consumer already registered on this topic")
)

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
}

// Registry adds consumers' handlers to a Watermill router with the inbox
// middleware, and runs their sweepers. Register everything before Run.
type Registry struct {
	router  *message.Router
	cfg     Config
	inbox   Inbox
	metrics *metrics
	log     *slog.Logger
	// tracer is nil with tracing off.
	tracer trace.Tracer

	mu       sync.Mutex
	handlers []*handlerConfig
	owners   map[string]string // command topic → owning consumer
	// made are the subscribers Config.Subscribers made: the registry owns
	// them and closes them when Run ends.
	made []message.Subscriber
}

// New returns a Registry adding handlers to router.
func New(router *message.Router, cfg Config) (*Registry, error) {
	if router == nil {
		return nil, errors.New("consumers: router is required")
	}
	if cfg.Pool == nil {
		return nil, errors.New("consumers: Config.Pool is required")
	}
	if cfg.Inbox == nil {
		return nil, errors.New("consumers: Config.Inbox is required")
	}
	cfg.setDefaults()
	r := &Registry{
		router:  router,
		cfg:     cfg,
		inbox:   cfg.Inbox,
		metrics: newMetrics(cfg.Registerer),
		log:     cfg.Logger,
		owners:  make(map[string]string),
	}
	if cfg.TracerProvider != nil {
		r.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	return r, nil
}

// Router is the Watermill router the handlers are added to.
func (r *Registry) Router() *message.Router { return r.router }

// AddEventHandler registers consumer's handler for events on topic (many
// consumers may handle the same events). topic must not be a command topic.
func (r *Registry) AddEventHandler(consumer, topic string, h Handler, opts ...Option) error {
	if r.isCommandTopic(topic) {
		return fmt.Errorf("consumers: event handler %s on %s: %w (commands.* carries commands; use AddCommandHandler)", consumer, topic, ErrWrongTopic)
	}
	return r.add(consumer, topic, core.KindEvent, h, opts)
}

// AddCommandHandler registers consumer as the one owner of the command
// topic (commands.<service>). A second owner of the same topic is refused
// with ErrCommandOwned; an event topic with ErrWrongTopic.
func (r *Registry) AddCommandHandler(consumer, topic string, h Handler, opts ...Option) error {
	if !r.isCommandTopic(topic) || topic == r.cfg.CommandTopicPrefix {
		return fmt.Errorf("consumers: command handler %s on %s: %w (want %s<service>; use AddEventHandler for events)", consumer, topic, ErrWrongTopic, r.cfg.CommandTopicPrefix)
	}
	r.mu.Lock()
	if owner, ok := r.owners[topic]; ok {
		r.mu.Unlock()
		return fmt.Errorf("consumers: command handler %s on %s: %w: %s", consumer, topic, ErrCommandOwned, owner)
	}
	r.mu.Unlock()
	if err := r.add(consumer, topic, core.KindCommand, h, opts); err != nil {
		return err
	}
	r.mu.Lock()
	r.owners[topic] = consumer
	r.mu.Unlock()
	return nil
}

func (r *Registry) isCommandTopic(topic string) bool {
	return strings.HasPrefix(topic, r.cfg.CommandTopicPrefix)
}

func (r *Registry) add(consumer, topic string, kind core.Kind, h Handler, opts []Option) error {
	if consumer == "" || topic == "" || h == nil {
		return errors.New("consumers: consumer name, topic and handler are required")
	}
	hc := &handlerConfig{consumer: consumer, topic: topic, kind: kind, handler: h, hold: r.cfg.HoldTime}
	for _, o := range opts {
		o(hc)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, other := range r.handlers {
		if other.consumer == consumer && other.topic == topic {
			return fmt.Errorf("consumers: %s on %s: %w", consumer, topic, ErrDuplicateHandler)
		}
	}
	sub := hc.subscriber
	if sub == nil {
		if r.cfg.Subscribers == nil {
			return fmt.Errorf("consumers: %s: no subscriber (set Config.Subscribers or WithSubscriber)", consumer)
		}
		var err error
		if sub, err = r.cfg.Subscribers(consumer); err != nil {
			return fmt.Errorf("consumers: subscriber for %s: %w", consumer, err)
		}
		r.made = append(r.made, sub)
	}
	hc.handOff = newHandOff()
	hc.lanes = newLanes(r, hc)
	wh := r.router.AddConsumerHandler(consumer+"@"+topic, topic, sequenced{sub}, r.middleware(hc))
	// Retry outermost, then Recoverer: a panicking handler becomes an error
	// (its transaction is rolled back by the deferred Rollback on the way
	// out) and is retried like any other. Permanent errors never get here:
	// the middleware parks them and acknowledges.
	retry := r.cfg.Retry
	retry.ShouldRetry = func(p middleware.RetryParams) bool { return !IsPermanent(p.Err) }
	retry.OnRetryHook = nil
	wh.AddMiddleware(retry.Middleware, middleware.Recoverer)
	r.handlers = append(r.handlers, hc)
	r.metrics.init(consumer)
	return nil
}

// middleware is the inbox around one handler: decode, kind check, inbox
// transaction, poison parking, metrics, and draining of held successors.
func (r *Registry) middleware(hc *handlerConfig) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		ctx := msg.Context()
		// Messages join the batch queue in delivery order (see batch.go);
		// every other path lets the next message through at once.
		seq, sequenced := ctx.Value(seqKey{}).(uint64)
		if sequenced {
			hc.handOff.wait(ctx, seq)
			defer hc.handOff.pass(seq)
		}
		e, err := core.EnvelopeFromMessage(msg)
		if err != nil {
			return r.reject(ctx, hc, msg, e, err.Error())
		}
		if e.Kind != hc.kind {
			return r.reject(ctx, hc, msg, e, fmt.Sprintf("record of kind %s delivered to %s handler %s on %s", e.Kind, hc.kind, hc.consumer, hc.topic))
		}
		e.Topic = hc.topic
		ctx, span := r.startApply(ctx, hc, msg, e)
		if hc.noInbox {
			if sequenced {
				hc.handOff.pass(seq)
			}
			err := r.applyWithoutInbox(ctx, hc, e)
			endApply(span, Outcome{Disposition: core.DispositionApplied}, err)
			return err
		}
		lane := hc.lanes.of(e)
		p := lane.enqueue(e)
		if sequenced {
			hc.handOff.pass(seq)
		}
		// The batch counts the outcome and drains the successors of what
		// it applied.
		out, err := lane.receive(ctx, p)
		endApply(span, out, err)
		if err != nil {
			return r.failed(ctx, hc, err)
		}
		return nil
	}
}

// apply wraps the team's handler with the latency and lag metrics.
func (r *Registry) apply(hc *handlerConfig) Handler {
	return func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		start := time.Now()
		err := hc.handler(ctx, tx, e)
		if err == nil {
			r.metrics.observeApply(hc.consumer, start, e.OccurredAt)
		}
		return err
	}
}

// failed handles a failed Receive: a permanent handler error parks the
// event and acknowledges; anything else goes back to Retry.
func (r *Registry) failed(ctx context.Context, hc *handlerConfig, err error) error {
	var ae *ApplyError
	if !errors.As(err, &ae) || !IsPermanent(ae.Err) {
		return err
	}
	out, perr := r.inbox.ParkPoison(ctx, hc.consumer, hc.ordered, ae.Envelope, ae.Err.Error())
	if perr != nil {
		return errors.Join(err, perr)
	}
	r.recorded(hc, out)
	return nil
}

func (r *Registry) reject(ctx context.Context, hc *handlerConfig, msg *message.Message, e core.Envelope, reason string) error {
	id := e.EventID
	if id == "" {
		id = msg.Metadata.Get(core.HeaderEventID)
	}
	if id == "" {
		id = msg.UUID
	}
	if id == "" {
		// Nothing to key an inbox row on: count, log and drop, since
		// redelivering it can never make it applicable.
		r.metrics.record(hc.consumer, core.DispositionRejected, 1)
		r.log.Warn("consumer rejected a record without an event ID", "consumer", hc.consumer, "topic", hc.topic, "reason", reason)
		return nil
	}
	out, err := r.inbox.Reject(ctx, hc.consumer, id, e, msg.Metadata, msg.Payload, reason)
	if err != nil {
		return err
	}
	r.recorded(hc, out)
	return nil
}

func (r *Registry) applyWithoutInbox(ctx context.Context, hc *handlerConfig, e core.Envelope) error {
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error { return r.apply(hc)(ctx, tx, e) })
	if err != nil {
		return err
	}
	r.metrics.record(hc.consumer, core.DispositionApplied, 1)
	return nil
}

// recorded turns one outcome into metrics and log lines.
func (r *Registry) recorded(hc *handlerConfig, out Outcome) {
	r.metrics.record(hc.consumer, out.Disposition, 1)
	attrs := []any{"consumer", hc.consumer, "event_id", out.EventID, "aggregate_type", out.AggregateType,
		"aggregate_id", out.AggregateID, "revision", out.Revision, "reason", out.Reason}
	switch out.Disposition {
	case core.DispositionHeld:
		r.metrics.gaps.WithLabelValues(hc.consumer).Inc()
		r.log.Info("consumer holds an event received ahead of its predecessor", attrs...)
	case core.DispositionParkedGap:
		r.log.Warn("consumer parked an event behind a parked aggregate", attrs...)
	case core.DispositionParkedPoison:
		r.log.Error("consumer parked a poison event", attrs...)
	case core.DispositionRejected:
		r.log.Warn("consumer rejected a record", attrs...)
	case core.DispositionDuplicate:
		r.log.Debug("consumer absorbed a duplicate", attrs...)
	}
}

// applyAll is the handler's BatchHandler with the metrics and a panic
// turned into an error; nil when the handler has none.
func (r *Registry) applyAll(hc *handlerConfig) BatchHandler {
	if hc.batch == nil {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx, es []core.Envelope) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("batch handler panicked: %v", p)
			}
		}()
		start := time.Now()
		if err := hc.batch(ctx, tx, es); err != nil {
			return err
		}
		// Each event's share of the batch's time.
		per := time.Since(start) / time.Duration(len(es))
		for _, e := range es {
			r.metrics.observeApply(hc.consumer, time.Now().Add(-per), e.OccurredAt)
		}
		return nil
	}
}

// safeApply is apply for re-drives, which run outside Watermill's
// Recoverer: a panic becomes an error so the sweeper survives it.
func (r *Registry) safeApply(hc *handlerConfig) Handler {
	apply := r.apply(hc)
	return func(ctx context.Context, tx pgx.Tx, e core.Envelope) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("handler panicked: %v", p)
			}
		}()
		return apply(ctx, tx, e)
	}
}

// Run runs the router and every consumer's sweeper until ctx is cancelled
// (or the router is closed), then stops both; in-flight messages finish or
// stay unacknowledged. It returns the router's error. The subscribers
// Config.Subscribers made are closed before it returns: when the
// cancellation reaches the router's handlers before its Close does, the
// router leaves them open (their connections, group members and pools
// would run on); Close is idempotent on every subscriber Posthorn makes.
func (r *Registry) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.mu.Lock()
	handlers := append([]*handlerConfig(nil), r.handlers...)
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, hc := range handlers {
		if hc.noInbox {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.sweep(ctx, hc)
		}()
	}
	go func() {
		<-ctx.Done()
		_ = r.router.Close()
	}()
	err := r.router.Run(ctx)
	cancel()
	wg.Wait()
	r.mu.Lock()
	made := r.made
	r.mu.Unlock()
	for _, s := range made {
		_ = s.Close()
	}
	return err
}

// Running is closed once the router has subscribed every handler.
func (r *Registry) Running() <-chan struct{} { return r.router.Running() }
