// Package lifecycle is the Start/Stop machinery both relay modes share:
// a soft stop lets the loop finish its batch and release its leases, a
// hard stop cancels it, and Stop always waits for it to exit.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/posthorn/posthorn/relay"
)

// Lifecycle is the Start/Stop/Stopped machinery the polling relay and the
// CDC relay share. A soft stop closes SoftStop, so the loop finishes or
// abandons its batch, writes what was ACKed and releases its leases; if
// Stop's context ends first, the loop's context is cancelled (a hard
// stop) and Stop waits for the loop to exit. Cancelling Start's context
// is a soft stop.
type Lifecycle struct {
	ready      atomic.Pointer[error]
	started    atomic.Bool
	stopOnce   sync.Once
	softStop   chan struct{}
	hardCancel context.CancelFunc
	stopped    chan struct{}
}

// New returns a lifecycle that has not started.
func New() *Lifecycle {
	l := &Lifecycle{softStop: make(chan struct{}), stopped: make(chan struct{})}
	l.SetReady(errors.New("relay not started"))
	return l
}

// SetReady records the outcome of the relay's last lease round trip: nil
// when it succeeded.
func (l *Lifecycle) SetReady(err error) { l.ready.Store(&err) }

// Ready is nil while the relay runs and its last lease round trip
// succeeded (for /readyz).
func (l *Lifecycle) Ready() error {
	select {
	case <-l.stopped:
		return errors.New("relay stopped")
	default:
	}
	return *l.ready.Load()
}

// Stopping reports whether a soft stop was asked for.
func (l *Lifecycle) Stopping() bool {
	select {
	case <-l.softStop:
		return true
	default:
		return false
	}
}

// Start runs loop in the background, with helpers beside it, and returns
// at once. The helpers' context ends when loop returns; Stopped is closed
// once loop and every helper have returned.
func (l *Lifecycle) Start(ctx context.Context, loop func(context.Context), helpers ...func(context.Context)) error {
	if !l.started.CompareAndSwap(false, true) {
		return relay.ErrAlreadyStarted
	}
	workCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.hardCancel = cancel
	var wg sync.WaitGroup
	for _, h := range helpers {
		wg.Add(1)
		go func() { defer wg.Done(); h(workCtx) }()
	}
	go func() {
		select {
		case <-ctx.Done():
			l.signalStop()
		case <-l.stopped:
		}
	}()
	go func() {
		loop(workCtx)
		cancel()
		wg.Wait()
		close(l.stopped)
	}()
	return nil
}

func (l *Lifecycle) signalStop() { l.stopOnce.Do(func() { close(l.softStop) }) }

// Stop stops softly and waits; see the type's doc. Stop before Start
// returns nil.
func (l *Lifecycle) Stop(ctx context.Context) error {
	if !l.started.Load() {
		return nil
	}
	l.signalStop()
	select {
	case <-l.stopped:
		return nil
	case <-ctx.Done():
		l.hardCancel()
		<-l.stopped
		return ctx.Err()
	}
}

// Stopped is closed when the loop and its helpers have returned.
func (l *Lifecycle) Stopped() <-chan struct{} { return l.stopped }

// SoftStop is closed when a soft stop was asked for.
func (l *Lifecycle) SoftStop() <-chan struct{} { return l.softStop }

// Sleep waits d unless a soft stop or the end of ctx comes first (a relay's
// backoff and its idle waits).
func (l *Lifecycle) Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.softStop:
	case <-ctx.Done():
	}
}
