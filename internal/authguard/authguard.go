// Package authguard throttles token guessing: it counts failed
// authentications per remote address and, once an address has failed Max
// times within Window, refuses every authentication from it (the right
// token too, so a guess that happens to hit tells the guesser nothing)
// until Window has passed since the failure that blocked it.
//
// Invariants: an address is blocked only by its own failures; a success
// does not reset the count (a guesser holding one valid token cannot use
// it to keep guessing others); memory is bounded by MaxAddresses, past
// which new addresses share one count. A nil *Guard never blocks: that is
// throttling off.
package authguard

import (
	"net"
	"sync"
	"time"
)

// Defaults of New, the numbers docs/security.md states.
const (
	// DefaultMax failed authentications from one address within
	// DefaultWindow block it.
	DefaultMax = 10
	// DefaultWindow is both the span failures are counted over and how
	// long a blocked address stays blocked.
	DefaultWindow = time.Minute
	// MaxAddresses bounds the addresses tracked at once; past it, new
	// addresses are counted together under one shared entry.
	MaxAddresses = 10000
)

// overflow is the shared entry of addresses past MaxAddresses.
const overflow = "(other addresses)"

// Guard counts failures per address. Its methods are safe for concurrent
// use.
type Guard struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	addrs map[string]*entry
}

type entry struct {
	first    time.Time // first failure of the current window
	failures int
	until    time.Time // blocked before this instant
}

// New returns a guard that blocks an address after max failures within
// window, for window. max ≤ 0 returns nil: no throttling.
func New(max int, window time.Duration) *Guard {
	if max <= 0 {
		return nil
	}
	if window <= 0 {
		window = DefaultWindow
	}
	return &Guard{max: max, window: window, now: time.Now, addrs: map[string]*entry{}}
}

// Host is the address part of a request's RemoteAddr ("host:port"), the
// key failures are counted under.
func Host(remoteAddr string) string {
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return h
	}
	return remoteAddr
}

// Blocked reports whether addr is blocked now and, if so, for how much
// longer.
func (g *Guard) Blocked(addr string) (time.Duration, bool) {
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.addrs[g.key(addr)]
	if e == nil {
		return 0, false
	}
	left := e.until.Sub(g.now())
	return left, left > 0
}

// Failed records a failed authentication from addr and returns the
// failures counted in the current window and whether this one blocked the
// address.
func (g *Guard) Failed(addr string) (failures int, blocked bool) {
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if _, ok := g.addrs[addr]; !ok && len(g.addrs) >= MaxAddresses {
		g.prune(now)
	}
	k := g.key(addr)
	e := g.addrs[k]
	if e == nil || g.expired(e, now) {
		e = &entry{first: now}
		g.addrs[k] = e
	}
	return g.count(e, now)
}

func (g *Guard) count(e *entry, now time.Time) (int, bool) {
	e.failures++
	if e.failures == g.max {
		e.until = now.Add(g.window)
		return e.failures, true
	}
	return e.failures, false
}

// key is addr's entry, or the shared one when addr is not tracked and
// the table is full.
func (g *Guard) key(addr string) string {
	if _, ok := g.addrs[addr]; ok || len(g.addrs) < MaxAddresses {
		return addr
	}
	return overflow
}

// expired reports whether e's window and block have both passed.
func (g *Guard) expired(e *entry, now time.Time) bool {
	return now.Sub(e.first) >= g.window && !now.Before(e.until)
}

// prune drops the expired entries.
func (g *Guard) prune(now time.Time) {
	for k, e := range g.addrs {
		if g.expired(e, now) {
			delete(g.addrs, k)
		}
	}
}
