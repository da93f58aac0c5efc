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
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/core"
)

// Errors of registration.
var (
	// ErrCommandOwned: a command topic already has its one owner.
	ErrCommandOwned = errors.New("command topic already has an owner")
	// ErrWrongTopic: an event handler on a command topic or the reverse.
	ErrWrongTopic = errors.New("topic does not carry this kind")
	// ErrDuplicateHandler: the consumer is already registered on the topic.
	ErrDuplicateHandler = errors.New("consumer already registered on this topic")
)

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
	// started is when Run started, written before it starts the handlers.
	started time.Time
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
	wh.AddMiddleware(retrying(r.cfg.Retry, func(err error) bool { return !core.IsPermanent(err) }), middleware.Recoverer)
	r.handlers = append(r.handlers, hc)
	r.metrics.init(consumer)
	hc.metrics = r.metrics.applyOf(consumer)
	return nil
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
	r.started = time.Now()
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
