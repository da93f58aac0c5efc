package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/metricshttp"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
)

// exampleConsumer is a built-in consumer: how it registers its handler,
// and its own tables, which `posthorn migrate --consumer` applies beside
// the consumer schema.
type exampleConsumer struct {
	register func(*consumers.Registry, string, ...consumers.Option) error
	tables   postgres.Tables
}

// exampleConsumers are the built-in consumers, by name.
var exampleConsumers = map[string]exampleConsumer{
	projection.Name: {projection.Register, postgres.Tables{Consumer: projection.Name, FS: projection.Tables}},
	auditlog.Name:   {auditlog.Register, postgres.Tables{Consumer: auditlog.Name, FS: auditlog.Tables}},
}

// migrateConsumerDatabase brings the consumer schema and then every
// example consumer's tables up to date; progress, when set, hears what
// each applied (the consumer schema's under "", the tables' under the
// consumer's name).
func migrateConsumerDatabase(ctx context.Context, dsn string, progress func(consumer string, applied []string)) error {
	applied, err := postgres.Upgrade(ctx, dsn, postgres.ConsumerSchema)
	if err != nil {
		return err
	}
	if progress != nil {
		progress("", applied)
	}
	for _, n := range exampleNames() {
		if applied, err = postgres.UpgradeTables(ctx, dsn, exampleConsumers[n].tables); err != nil {
			return fmt.Errorf("the tables of %s: %w", n, err)
		}
		if progress != nil {
			progress(n, applied)
		}
	}
	return nil
}

// requireConsumerDatabase is requireSchema for the consumer schema and
// every example consumer's tables.
func requireConsumerDatabase(ctx context.Context, pool *pgxpool.Pool) error {
	if err := requireSchema(ctx, pool, postgres.ConsumerSchema); err != nil {
		return err
	}
	for _, n := range exampleNames() {
		st, err := postgres.CheckTables(ctx, pool, exampleConsumers[n].tables)
		if err != nil {
			return fmt.Errorf("config key consumer.database.url: %w", err)
		}
		if !st.Current() {
			return fmt.Errorf("the tables of the example consumer %s are missing or older than this posthorn in the database of consumer.database.url%s: run `posthorn migrate --consumer` first",
				n, pendingList(st))
		}
	}
	return nil
}

func exampleNames() []string {
	names := make([]string, 0, len(exampleConsumers))
	for n := range exampleConsumers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// consumeOptions configures runConsumers beyond the configuration: the
// demo passes its in-process memory subscriber here.
type consumeOptions struct {
	only string
	// bootstrap is a topic a replay filled for a consumer that starts
	// mid-history (--bootstrap-topic): read beside the live topic.
	bootstrap string
	hold      time.Duration
	memory    message.Subscriber
	log       *slog.Logger
	// tracer traces the deliveries; nil is tracing off.
	tracer trace.TracerProvider
	// unsafeNoInbox runs the handlers without the inbox: the fault suite's
	// negative control (--unsafe-no-inbox, only with -tags posthorn_unsafe),
	// never for real use.
	unsafeNoInbox bool
}

func runConsume(ctx context.Context, args []string) error {
	fs := newFlags("consume", "consumer.database.url", "metrics.listen", "sink.kind", "sink.kafka.brokers")
	only := fs.String("only", "", "run only this consumer: "+fmt.Sprint(exampleNames()))
	bootstrap := fs.String("bootstrap-topic", "", "also read this topic, which posthorn replay --topic filled with the history: a consumer that starts mid-history (docs/consumers.md); needs --only")
	hold := fs.Duration("hold", 0, "how long an event ahead of its predecessor is held before its account is parked (default: config key consumer.hold, "+consumers.DefaultHoldTime.String()+")")
	unsafeNoInbox := unsafeFlag(fs.FlagSet, "unsafe-no-inbox", "UNSAFE, tests only: apply without the inbox (no dedup, no gap check)")
	p, err := fs.start(ctx, args, needs{check: func(*configs.Config) error {
		if *hold < 0 {
			return fmt.Errorf("--hold must be positive, is %s", *hold)
		}
		if *bootstrap != "" && *only == "" {
			return errors.New("--bootstrap-topic needs --only: the topic a replay filled is one consumer's")
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close() // flushes the spans
	return runConsumers(ctx, p.cfg, consumeOptions{only: *only, bootstrap: *bootstrap, hold: *hold, log: p.log, tracer: p.tracer, unsafeNoInbox: *unsafeNoInbox})
}

// runConsumers runs the example consumers until ctx is cancelled, then
// stops the router softly (in-flight messages finish or stay
// unacknowledged for redelivery) and returns nil.
func runConsumers(ctx context.Context, cfg configs.Config, o consumeOptions) error {
	names := exampleNames()
	if o.only != "" {
		if _, ok := exampleConsumers[o.only]; !ok {
			return fmt.Errorf("--only %q: want one of %v", o.only, names)
		}
		names = []string{o.only}
	}
	if err := cfg.RequireConsumerDatabase(); err != nil {
		return err
	}
	if o.hold == 0 {
		o.hold = cfg.Consumer.Hold
	}
	log := o.log
	if cfg.Consumer.InstanceID != "" && cfg.Sink.Kind != "kafka" {
		log.Warn("config key consumer.instance_id is set but only Kafka has static members; ignored", "sink", cfg.Sink.Kind)
	}
	// A static member fenced by another process with the same instance ID
	// stops the consumers: running on would take the ID back in turn.
	parent := ctx
	ctx, stop := context.WithCancelCause(parent)
	defer stop(nil)
	fenced := func(err error) { stop(fmt.Errorf("config key consumer.instance_id: %w", err)) }
	pool, err := openConsumerPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	postgres.WarnIfSuperuser(ctx, pool, log, "consume", postgres.RoleConsumer)
	if err := postgres.CheckConsumerRoles(ctx, pool, names); err != nil {
		return fmt.Errorf("config key consumer.database.url: %w", err)
	}
	wlog := consumers.RouterLogger(log)
	reg := newRegistry()
	factory, err := openSubscribers(cfg.Sink, brokers.Options{Logger: wlog, Memory: o.memory,
		Kafka: kafkagroup.Options{Registerer: reg, InstanceID: cfg.Consumer.InstanceID, Fenced: fenced}}) // brokers.go
	if err != nil {
		return err
	}
	factory = retrySubscribe(factory, log)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, wlog)
	if err != nil {
		return err
	}
	registry, err := consumers.New(router, consumers.Config{
		Pool:               pool,
		Inbox:              inboxstore.New(pool),
		Subscribers:        factory,
		Registerer:         reg,
		Logger:             log,
		HoldTime:           o.hold,
		CommandTopicPrefix: cfg.Sink.CommandTopicPrefix,
		TracerProvider:     o.tracer,
	})
	if err != nil {
		return err
	}
	var handlerOpts []consumers.Option
	if o.unsafeNoInbox {
		log.Warn("UNSAFE --unsafe-no-inbox: handlers run without the inbox, so repeats apply twice; for negative-control tests only")
		handlerOpts = append(handlerOpts, consumers.WithoutInbox())
	}
	// The example consumers read account events wherever sink.format routes
	// them (debezium-outbox: outbox.event.account).
	topic := cfg.Sink.WireFormat().Topic(core.KindEvent, core.TopicEvents, core.AggregateAccount)
	for _, n := range names {
		if err := exampleConsumers[n].register(registry, topic, handlerOpts...); err != nil {
			return err
		}
		// The history from the replay's topic and the live topic, side by
		// side: the inbox holds a live event until its predecessors come
		// from the replay and absorbs the overlap.
		if o.bootstrap != "" {
			if err := exampleConsumers[n].register(registry, o.bootstrap, handlerOpts...); err != nil {
				return err
			}
		}
	}
	if cfg.Metrics.Listen != "" {
		broker := newSinkWatch(cfg.Sink)
		srv, err := metricshttp.Start(cfg.Metrics.Listen, reg, func() error {
			if !router.IsRunning() || router.IsClosed() {
				return errors.New("consumers not running")
			}
			pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := pool.Ping(pctx); err != nil {
				return errors.New("consumer database unreachable (consumer.database.url)")
			}
			return broker.ready(pctx)
		})
		if err != nil {
			return fmt.Errorf("config key metrics.listen: %w", err)
		}
		defer srv.Close()
		log.Info("consumer metrics listening", "addr", srv.Addr())
	}
	startRetention(ctx, cfg, pool, nil, names, log) // inbox retention on retention.interval
	log.Info("consumers starting", "consumers", names, "sink", cfg.Sink.Kind, "topic", topic, "hold", o.hold.String(),
		"instance_id", cfg.Consumer.InstanceID)
	if err := registry.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	if ctx.Err() != nil && parent.Err() == nil {
		return context.Cause(ctx) // fenced
	}
	log.Info("consumers stopped")
	return nil
}

// openConsumerPool connects to consumer.database.url and checks that
// `posthorn migrate --consumer` has been run with this binary's migrations.
func openConsumerPool(ctx context.Context, cfg configs.Config) (*pgxpool.Pool, error) {
	pool, err := postgres.Connect(ctx, cfg.Consumer.Database.URL, 8)
	if err != nil {
		return nil, fmt.Errorf("config key consumer.database.url: %w", err)
	}
	if err := requireConsumerDatabase(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func runConsumeRelease(ctx context.Context, args []string) error {
	fs := newFlags("consume release", "consumer.database.url")
	consumer := fs.String("consumer", "", "consumer name, e.g. "+projection.Name+" (required)")
	account := fs.String("account", "", "account whose park to lift (required)")
	aggType := fs.String("aggregate-type", core.AggregateAccount, "aggregate type (journal for commands)")
	p, err := fs.start(ctx, args, needs{consumer: true, check: func(*configs.Config) error {
		if *consumer == "" || *account == "" {
			return errors.New("--consumer and --account are required")
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close()
	n, err := inboxstore.New(p.consumer).Release(ctx, *consumer, *aggType, *account)
	if err != nil {
		return err
	}
	if n == 0 {
		fmt.Printf("%s %s: nothing parked for consumer %s\n", printable(*aggType), printable(*account), printable(*consumer))
		return nil
	}
	fmt.Printf("released %d event(s) of %s %s for consumer %s; a running consumer re-drives them in revision order (they park again after the hold time if the predecessor is still missing)\n",
		n, printable(*aggType), printable(*account), printable(*consumer))
	return nil
}

type consumerStatus struct {
	Consumer           string                `json:"consumer"`
	Events             map[string]int64      `json:"events"`
	DuplicatesAbsorbed int64                 `json:"duplicates_absorbed"`
	Parked             []parkedAccountStatus `json:"parked"`
}

type parkedAccountStatus struct {
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Events        int       `json:"events"`
	Reason        string    `json:"reason"`
	ParkedAt      time.Time `json:"parked_at"`
}

func runConsumeStatus(ctx context.Context, args []string) error {
	fs := newFlags("consume status", "consumer.database.url")
	consumer := fs.String("consumer", "", "one consumer (default: the example consumers)")
	asJSON := fs.Bool("json", false, "print JSON")
	p, err := fs.start(ctx, args, needs{consumer: true})
	if err != nil {
		return err
	}
	defer p.close()
	in := inboxstore.New(p.consumer)
	names := exampleNames()
	if *consumer != "" {
		names = []string{*consumer}
	}
	var out []consumerStatus
	for _, n := range names {
		c, err := in.Count(ctx, n)
		if err != nil {
			return err
		}
		parked, err := in.Parked(ctx, n)
		if err != nil {
			return err
		}
		s := consumerStatus{Consumer: n, Events: map[string]int64{}, DuplicatesAbsorbed: c.DuplicatesAbsorbed, Parked: []parkedAccountStatus{}}
		for d, k := range c.Events {
			s.Events[string(d)] = k
		}
		for _, p := range parked {
			s.Parked = append(s.Parked, parkedAccountStatus{p.Type, p.ID, p.Events, p.Reason, p.ParkedAt})
		}
		out = append(out, s)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	for _, s := range out {
		keys := make([]string, 0, len(s.Events))
		for k := range s.Events {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		fmt.Printf("%s:", printable(s.Consumer))
		for _, k := range keys {
			fmt.Printf(" %s=%d", k, s.Events[k])
		}
		fmt.Printf(" duplicates_absorbed=%d parked_accounts=%d\n", s.DuplicatesAbsorbed, len(s.Parked))
		for _, p := range s.Parked {
			fmt.Printf("  parked %s %s (%d events) since %s: %s\n", printable(p.AggregateType), printable(p.AggregateID), p.Events,
				p.ParkedAt.UTC().Format(time.RFC3339), printable(p.Reason))
		}
	}
	return nil
}

// Start-up retry bounds for retrySubscribe.
const (
	subscribeRetryFirst = 500 * time.Millisecond
	subscribeRetryMax   = 30 * time.Second
)

// retrySubscribe makes a broker that cannot be reached when `posthorn
// consume` starts a wait, not an exit: every Subscribe is retried with
// doubling backoff (subscribeRetryFirst up to subscribeRetryMax), each
// failure logged at WARN, until it succeeds or the process is stopped. A
// long-running consumer must outlive a broker restart that overlaps its
// own (re)start; once subscribed, reconnecting is the subscriber's job
// (watermill-kafka reconnects by itself). Configuration errors are caught
// before this, by openSubscribers.
func retrySubscribe(f consumers.SubscriberFactory, log *slog.Logger) consumers.SubscriberFactory {
	return func(consumer string) (message.Subscriber, error) {
		sub, err := f(consumer)
		if err != nil {
			return nil, err
		}
		return retryingSubscriber{Subscriber: sub, consumer: consumer, log: log}, nil
	}
}

type retryingSubscriber struct {
	message.Subscriber
	consumer string
	log      *slog.Logger
}

func (r retryingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	wait := subscribeRetryFirst
	for attempt := 1; ; attempt++ {
		ch, err := r.Subscriber.Subscribe(ctx, topic)
		if err == nil {
			if attempt > 1 {
				r.log.Info("subscribed after retrying", "consumer", r.consumer, "topic", topic, "attempts", attempt)
			}
			return ch, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		r.log.Warn("cannot subscribe; broker unreachable? retrying", "consumer", r.consumer, "topic", topic,
			"attempt", attempt, "retry_in", wait.String(), "error", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, subscribeRetryMax)
	}
}
