package consumers_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

func nop(context.Context, pgx.Tx, core.Envelope) error { return nil }

// newRegistry is a registry with cfg on a fresh consumer database, whose
// subscribers are all the returned gochannel (the caller closes it).
func newRegistry(t *testing.T, cfg consumers.Config) (*pgxpool.Pool, *gochannel.GoChannel, *consumers.Registry) {
	t.Helper()
	_, pool := pgtest.Consumer(t)
	ch := gochannel.NewGoChannel(gochannel.Config{}, nil)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool = pool
	cfg.Inbox = inboxstore.New(pool)
	cfg.Subscribers = func(string) (message.Subscriber, error) { return ch, nil }
	reg, err := consumers.New(router, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool, ch, reg
}

func run(t *testing.T, reg *consumers.Registry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-reg.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start")
	}
}

func event(acc string, rev int64, kind core.Kind) *message.Message {
	return core.Envelope{EventID: fmt.Sprintf("%s-%d", acc, rev), Kind: kind, Type: core.TypeAccountPosted,
		AggregateType: core.AggregateAccount, AggregateID: acc, Revision: rev, Payload: []byte(`{}`)}.ToMessage()
}

// publish publishes msg on topic, as the relay would.
func publish(t *testing.T, ch *gochannel.GoChannel, topic string, msg *message.Message) {
	t.Helper()
	if err := ch.Publish(topic, msg); err != nil {
		t.Fatal(err)
	}
}

func waitDisposition(t *testing.T, in *inboxstore.Inbox, consumer, id string, want core.Disposition) core.InboxRecord {
	t.Helper()
	var rec core.InboxRecord
	wait.ForStatus(t, 20*time.Second, fmt.Sprintf("%s of %s to be %s", id, consumer, want), func() (bool, string) {
		recs, err := in.Dispositions(context.Background(), consumer, []string{id})
		if err != nil {
			t.Fatal(err)
		}
		rec = recs[id]
		return rec.Disposition == want, fmt.Sprintf("%+v", rec)
	})
	return rec
}

func TestRegistrationSeparatesEventsAndCommands(t *testing.T) {
	t.Parallel()
	_, ch, reg := newRegistry(t, consumers.Config{})
	defer ch.Close()

	if err := reg.AddEventHandler("audit", "commands.payouts", nop); !errors.Is(err, consumers.ErrWrongTopic) {
		t.Fatalf("event handler on a command topic: %v", err)
	}
	if err := reg.AddCommandHandler("payouts", core.TopicEvents, nop); !errors.Is(err, consumers.ErrWrongTopic) {
		t.Fatalf("command handler on the event topic: %v", err)
	}
	if err := reg.AddCommandHandler("payouts", "commands.", nop); !errors.Is(err, consumers.ErrWrongTopic) {
		t.Fatalf("command handler on the bare prefix: %v", err)
	}
	if err := reg.AddCommandHandler("payouts", "commands.payouts", nop); err != nil {
		t.Fatal(err)
	}
	if err := reg.AddCommandHandler("payouts-2", "commands.payouts", nop); !errors.Is(err, consumers.ErrCommandOwned) {
		t.Fatalf("second owner of a command topic: %v", err)
	}
	// Events fan out: many consumers on one event topic.
	for _, c := range []string{"a", "b"} {
		if err := reg.AddEventHandler(c, core.TopicEvents, nop); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.AddEventHandler("a", core.TopicEvents, nop); !errors.Is(err, consumers.ErrDuplicateHandler) {
		t.Fatalf("same consumer twice on a topic: %v", err)
	}
}

// The kind header is checked at run time too: an event on a command
// topic (or a command on the event topic) is rejected, never handled.
func TestRuntimeKindMismatchIsRejected(t *testing.T) {
	t.Parallel()
	pool, ch, reg := newRegistry(t, consumers.Config{})
	defer ch.Close()
	var called atomic.Int32
	h := func(context.Context, pgx.Tx, core.Envelope) error { called.Add(1); return nil }
	if err := reg.AddCommandHandler("payouts", "commands.payouts", h); err != nil {
		t.Fatal(err)
	}
	if err := reg.AddEventHandler("audit", core.TopicEvents, h); err != nil {
		t.Fatal(err)
	}
	run(t, reg)
	publish(t, ch, "commands.payouts", event("acc", 1, core.KindEvent))
	publish(t, ch, core.TopicEvents, event("acc", 2, core.KindCommand))
	bad := message.NewMessage("no-headers", []byte("x"))
	publish(t, ch, core.TopicEvents, bad)
	rec := waitDisposition(t, inboxstore.New(pool), "payouts", "acc-1", core.DispositionRejected)
	t.Logf("reason: %s", rec.Reason)
	waitDisposition(t, inboxstore.New(pool), "audit", "acc-2", core.DispositionRejected)
	rec = waitDisposition(t, inboxstore.New(pool), "audit", "no-headers", core.DispositionRejected)
	t.Logf("reason: %s", rec.Reason)
	if n := called.Load(); n != 0 {
		t.Fatalf("handler called %d times for mismatching records", n)
	}
	// Control: matching kinds are handled.
	publish(t, ch, "commands.payouts", event("cmd", 1, core.KindCommand))
	waitDisposition(t, inboxstore.New(pool), "payouts", "cmd-1", core.DispositionApplied)
}

// A transient handler error (and a panic) is retried with backoff and then
// applied once; the failed attempts leave no effect.
func TestTransientErrorsAndPanicsAreRetried(t *testing.T) {
	t.Parallel()
	pool, ch, reg := newRegistry(t, consumers.Config{Retry: middleware.Retry{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}})
	defer ch.Close()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE fx (id text)`); err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
		if _, err := tx.Exec(ctx, `INSERT INTO fx VALUES ($1)`, e.EventID); err != nil {
			return err
		}
		switch attempts.Add(1) {
		case 1:
			return errors.New("downstream briefly unavailable")
		case 2:
			panic("handler bug hit once")
		}
		return nil
	}
	if err := reg.AddEventHandler("flaky", core.TopicEvents, h, consumers.DependsOnPredecessor()); err != nil {
		t.Fatal(err)
	}
	run(t, reg)
	publish(t, ch, core.TopicEvents, event("acc", 1, core.KindEvent))
	waitDisposition(t, inboxstore.New(pool), "flaky", "acc-1", core.DispositionApplied)
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM fx`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effects %d (%v), want 1 after %d attempts", n, err, attempts.Load())
	}
}

// A release from another process (the CLI) only changes the database; the
// running consumer's sweeper re-drives the released events.
func TestSweeperRedrivesAfterOutOfProcessRelease(t *testing.T) {
	t.Parallel()
	pool, ch, reg := newRegistry(t, consumers.Config{HoldTime: 100 * time.Millisecond})
	defer ch.Close()
	if err := reg.AddEventHandler("ordered", core.TopicEvents, nop, consumers.DependsOnPredecessor()); err != nil {
		t.Fatal(err)
	}
	run(t, reg)
	publish(t, ch, core.TopicEvents, event("acc", 2, core.KindEvent))
	waitDisposition(t, inboxstore.New(pool), "ordered", "acc-2", core.DispositionParkedGap)
	publish(t, ch, core.TopicEvents, event("acc", 1, core.KindEvent))
	waitDisposition(t, inboxstore.New(pool), "ordered", "acc-1", core.DispositionParkedGap)
	other := inboxstore.New(pool) // as `posthorn consume release` does
	if n, err := other.Release(context.Background(), "ordered", core.AggregateAccount, "acc"); err != nil || n != 2 {
		t.Fatalf("release: %d, %v", n, err)
	}
	waitDisposition(t, inboxstore.New(pool), "ordered", "acc-2", core.DispositionApplied)
	waitDisposition(t, inboxstore.New(pool), "ordered", "acc-1", core.DispositionApplied)
}

// The event that fills a gap re-drives the events held behind it at once:
// with the sweeper an hour away, nothing else could apply revision 2.
func TestHeldSuccessorDrainedWithoutTheSweeper(t *testing.T) {
	t.Parallel()
	pool, ch, reg := newRegistry(t, consumers.Config{HoldTime: time.Hour, SweepInterval: time.Hour})
	defer ch.Close()
	if err := reg.AddEventHandler("ordered", core.TopicEvents, nop, consumers.DependsOnPredecessor()); err != nil {
		t.Fatal(err)
	}
	run(t, reg)
	in := inboxstore.New(pool)
	publish(t, ch, core.TopicEvents, event("acc", 2, core.KindEvent))
	waitDisposition(t, in, "ordered", "acc-2", core.DispositionHeld)
	publish(t, ch, core.TopicEvents, event("acc", 1, core.KindEvent))
	waitDisposition(t, in, "ordered", "acc-1", core.DispositionApplied)
	waitDisposition(t, in, "ordered", "acc-2", core.DispositionApplied)
}

// closeCounting is a subscriber that counts its Close calls.
type closeCounting struct {
	message.Subscriber
	closed atomic.Int32
}

func (c *closeCounting) Close() error { c.closed.Add(1); return c.Subscriber.Close() }

// Every subscriber Config.Subscribers made is closed once Run has returned,
// whichever of the cancellation and the router's Close reached its handler
// first; a subscriber a test passes with WithSubscriber is left to its
// owner.
func TestRunClosesTheSubscribersItMade(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Consumer(t)
	for range 20 { // the race between cancellation and Close goes both ways
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		var made []*closeCounting
		reg, err := consumers.New(router, consumers.Config{Pool: pool, Inbox: inboxstore.New(pool),
			Subscribers: func(string) (message.Subscriber, error) {
				c := &closeCounting{Subscriber: gochannel.NewGoChannel(gochannel.Config{}, nil)}
				made = append(made, c)
				return c, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		own := &closeCounting{Subscriber: gochannel.NewGoChannel(gochannel.Config{}, nil)}
		if err := reg.AddEventHandler("a", core.TopicEvents, nop); err != nil {
			t.Fatal(err)
		}
		if err := reg.AddEventHandler("b", core.TopicEvents, nop, consumers.WithSubscriber(own)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- reg.Run(ctx) }()
		<-reg.Running()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if len(made) != 1 || made[0].closed.Load() == 0 {
			t.Fatalf("after Run: %d subscribers made, the first closed %d times; want one, closed", len(made), made[0].closed.Load())
		}
		_ = own.Close()
	}
}
