package consumers

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/posthorn/posthorn/core"
)

// Batching: the inbox applies the deliveries waiting for it in one
// transaction (Inbox.ReceiveBatch) instead of one transaction and
// one commit each. Watermill's router calls the middleware in a goroutine
// per message, so the messages of one consumer that are in flight at the
// same time — with a subscriber that delivers ahead of acknowledgements,
// many per partition — queue up while a batch commits and form the next
// one: the batch grows with the load, and a lone message is applied at
// once, without waiting for company. Every message is still acknowledged
// only after the batch holding its disposition committed.
//
// Order: the router's goroutines would let a message overtake the one
// delivered before it on the way to the queue, and for an ordered consumer
// a later revision that overtakes its predecessor is held (correct, but a
// detour through the inbox). So the subscriber of each handler is wrapped
// to number its messages in delivery order (sequenced), and a message joins
// the queue only after every message delivered before it has (handOff).
// The numbering is an optimisation, not a guarantee: a message that waited
// longer than handOffWait for its predecessors goes ahead, and the inbox's
// revision check keeps the effect in order either way.
//
// The same wrapper decodes each message's envelope from its headers, in its
// one goroutine, before the router starts the message's own: that goroutine
// is then shallow enough for its first stack, where the decoding, at the
// bottom of the router's and the middleware's frames, made every message's
// goroutine grow (and copy) its stack once. The envelope is therefore the
// record's as the subscriber delivered it: a router middleware that changes
// a message's metadata does not change what the inbox records.

const (
	// handOffWait bounds how long a message waits for the messages
	// delivered before it to reach the queue.
	handOffWait = time.Second
)

type seqKey struct{}

// delivery is what sequenced attaches to a message's context: its number
// in delivery order and its decoded envelope (or why it has none).
type delivery struct {
	seq uint64
	e   core.Envelope
	err error
}

// sequenced numbers a subscriber's messages in the order it delivers them
// and decodes their envelopes.
type sequenced struct {
	message.Subscriber
}

func (s sequenced) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		var seq uint64
		for m := range in {
			d := &delivery{seq: seq}
			d.e, d.err = core.EnvelopeFromMessage(m)
			m.SetContext(context.WithValue(m.Context(), seqKey{}, d))
			select {
			case out <- m:
				seq++
			case <-ctx.Done():
				// m stays unacknowledged; drain in so the subscriber can
				// close its channel.
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

// handOff lets messages through in their delivery order.
type handOff struct {
	mu      sync.Mutex
	next    uint64
	passed  map[uint64]bool
	waiting map[uint64]*waiter // seq → released when next reaches it
	// expiry releases the waiters that have waited handOffWait: one timer
	// for all of them, armed for the oldest (most messages wait a moment
	// for a predecessor, and a timer each cost an allocation and the
	// runtime's timer heap twice).
	expiry *time.Timer
	armed  bool
}

type waiter struct {
	ch    chan struct{}
	since time.Time
}

func newHandOff() *handOff {
	return &handOff{passed: map[uint64]bool{}, waiting: map[uint64]*waiter{}}
}

// wait blocks until every message numbered below seq has passed, ctx ends,
// or handOffWait is over.
func (h *handOff) wait(ctx context.Context, seq uint64) {
	h.mu.Lock()
	if seq <= h.next {
		h.mu.Unlock()
		return
	}
	w := &waiter{ch: make(chan struct{}), since: time.Now()}
	h.waiting[seq] = w
	if !h.armed {
		h.arm(handOffWait)
	}
	h.mu.Unlock()
	select {
	case <-w.ch:
	case <-ctx.Done():
		h.mu.Lock()
		if h.waiting[seq] == w {
			delete(h.waiting, seq)
		}
		h.mu.Unlock()
	}
}

// arm starts the expiry timer for d; h.mu is held.
func (h *handOff) arm(d time.Duration) {
	h.armed = true
	if h.expiry == nil {
		h.expiry = time.AfterFunc(d, h.expire)
		return
	}
	h.expiry.Reset(d)
}

// expire releases every waiter that has waited handOffWait and arms the
// timer for the oldest of the others.
func (h *handOff) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = false
	now := time.Now()
	var oldest time.Time
	for seq, w := range h.waiting {
		if now.Sub(w.since) >= handOffWait {
			close(w.ch)
			delete(h.waiting, seq)
		} else if oldest.IsZero() || w.since.Before(oldest) {
			oldest = w.since
		}
	}
	if !oldest.IsZero() {
		h.arm(handOffWait - now.Sub(oldest))
	}
}

// pass records that message seq has gone through; passing twice (a retry)
// is harmless.
func (h *handOff) pass(seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if seq < h.next {
		return
	}
	h.passed[seq] = true
	for h.passed[h.next] {
		delete(h.passed, h.next)
		h.next++
	}
	if w, ok := h.waiting[h.next]; ok {
		close(w.ch)
		delete(h.waiting, h.next)
	}
}

// pending is one delivery waiting for its batch.
type pending struct {
	ctx  context.Context
	e    core.Envelope
	done chan struct{}
	out  Outcome
	err  error
}

// lanes splits one handler's deliveries by aggregate into independent
// batchers, so that while one lane's batch waits for its commit the next
// lane's is applied. An aggregate always takes the same lane, so its
// events stay in delivery order, and two lanes never lock the same
// aggregate's position.
type lanes []*batcher

const laneCount = 4

var laneSeed = maphash.MakeSeed()

func newLanes(r *Registry, hc *handlerConfig) lanes {
	l := make(lanes, laneCount)
	for i := range l {
		l[i] = newBatcher(r, hc)
	}
	return l
}

func (l lanes) of(e core.Envelope) *batcher {
	return l[maphash.String(laneSeed, e.Aggregate().String())%uint64(len(l))]
}

// batcher groups one lane's concurrent deliveries into inbox batches, one
// batch at a time. A worker goroutine runs them for as long as the queue
// holds deliveries: the first delivery that finds no worker starts one, and
// the worker ends when it finds the queue empty, so a lone delivery is
// applied at once and an idle lane holds no goroutine. The deliveries'
// own goroutines only wait on their outcome (no election of the one that
// runs the next batch), and the depth a batch needs (the inbox, pgx, the
// team's handler) stays on the worker's stack: a message's goroutine keeps
// to its first one.
type batcher struct {
	r       *Registry
	hc      *handlerConfig
	mu      sync.Mutex
	queue   []*pending
	working bool // a worker is running; guarded by mu
}

func newBatcher(r *Registry, hc *handlerConfig) *batcher {
	return &batcher{r: r, hc: hc}
}

// enqueue adds a delivery, starting a worker if none runs; its outcome
// is then waited for with pending.outcome.
func (b *batcher) enqueue(ctx context.Context, e core.Envelope) *pending {
	p := &pending{ctx: ctx, e: e, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	start := !b.working
	b.working = true
	b.mu.Unlock()
	if start {
		go b.work()
	}
	return p
}

// outcome waits for p's outcome: until the batch holding it committed (or,
// failing as a whole, each of its deliveries was received on its own).
func (p *pending) outcome() (Outcome, error) {
	<-p.done
	return p.out, p.err
}

// work runs the queue's batches, MaxBatch deliveries at the most each, until
// it finds the queue empty. It recovers no panic: the handlers' panics are
// errors by the time they reach it (safeApply, applyAll), so a panic here
// is the inbox's own bug, and ending the process redelivers what was not
// committed where recovering would leave the lane's deliveries waiting for
// ever.
func (b *batcher) work() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.r.cfg.MaxBatch)
		if n == 0 {
			b.working = false
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		// The batch runs in its first delivery's context (its trace), and
		// outlives that delivery's cancellation: the others wait for it.
		b.run(context.WithoutCancel(batch[0].ctx), batch)
	}
}

// run records one batch; if the batch transaction fails as a whole, each
// delivery is received on its own, in order, so a failing event gets the
// handling Receive gives it (retry, poison) and the others are not held
// back by it. Outcomes are counted and their deliveries released as soon as
// they are committed; draining held successors comes after.
func (b *batcher) run(ctx context.Context, batch []*pending) {
	hc := b.hc
	es := make([]core.Envelope, len(batch))
	for i, p := range batch {
		es[i] = p.e
	}
	if len(batch) > 1 {
		res, err := b.r.inbox.ReceiveBatch(ctx, hc.consumer, hc.ordered, es, b.r.safeApply(hc), b.r.applyAll(hc))
		if err == nil {
			var counts [dispositionCount]int
			for i, p := range batch {
				p.out = res.Outcomes[i]
				counts[dispositionIndex(p.out.Disposition)]++
				b.r.logged(hc, p.out)
			}
			b.r.metrics.recordAll(hc.consumer, &counts)
			for _, p := range batch {
				close(p.done)
			}
			for _, ref := range res.Held {
				b.r.drain(ctx, hc, ref)
			}
			return
		}
	}
	var drain []core.AggregateKey
	for _, p := range batch {
		p.out, p.err = b.r.inbox.Receive(ctx, hc.consumer, hc.ordered, p.e, b.r.safeApply(hc))
		if p.err == nil {
			b.r.recorded(hc, p.out)
			if p.out.HeldSuccessors {
				drain = append(drain, p.e.Aggregate())
			}
		}
		close(p.done)
	}
	// The successors waiting in the inbox. The messages themselves are
	// done; a failing drain is retried by the sweeper.
	for _, ref := range drain {
		b.r.drain(ctx, hc, ref)
	}
}
