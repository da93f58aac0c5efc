package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
)

// sinkWatch names the configured sink's address in its errors, with the
// likely cause, and keeps the outcome of the last publish for /readyz. A
// sink that fails retryably otherwise reads "context deadline exceeded"
// (Kafka) or "outbound buffer limit exceeded" (NATS) with no address,
// every backoff, while /readyz says ready.
type sinkWatch struct {
	kind  string
	key   string   // the configuration key of the address
	addrs []string // host:port, never a URL's credentials
	// dial checks that something accepts TCP connections at addr.
	dial func(ctx context.Context, addr string) error

	mu      sync.Mutex
	lastErr error // the last publish's retryable failure, nil after a success
}

func newSinkWatch(c configs.Sink) *sinkWatch {
	key, addrs := sinkAddrs(c)
	return &sinkWatch{kind: c.Kind, key: key, addrs: addrs, dial: func(ctx context.Context, addr string) error {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err
	}}
}

// sinkAddrs is the configuration key of sink.kind's address and its
// host:port list; none for the in-process memory sink.
func sinkAddrs(c configs.Sink) (string, []string) {
	switch c.Kind {
	case "kafka":
		return "sink.kafka.brokers", c.Kafka.Brokers
	case "nats":
		return "sink.nats.url", urlHosts(c.NATS.URL, map[string]string{"nats": "4222", "tls": "4222"})
	case "amqp":
		return "sink.amqp.url", urlHosts(c.AMQP.URL, map[string]string{"amqp": "5672", "amqps": "5671"})
	case "redis":
		return "sink.redis.addr", []string{c.Redis.Addr}
	case "postgres":
		pc, err := postgres.ParseConfig(c.Postgres.URL)
		if err != nil {
			return "sink.postgres.url", nil
		}
		return "sink.postgres.url", []string{net.JoinHostPort(pc.ConnConfig.Host, strconv.Itoa(int(pc.ConnConfig.Port)))}
	}
	return "sink.kind", nil
}

// urlHosts returns the host:port of each comma-separated URL in s, the
// scheme's default port where none is given.
func urlHosts(s string, defaultPorts map[string]string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || u.Hostname() == "" {
			continue
		}
		port := u.Port()
		if port == "" {
			port = defaultPorts[u.Scheme]
		}
		out = append(out, net.JoinHostPort(u.Hostname(), port))
	}
	return out
}

// wrap returns s with its publishes watched: every retryable failure is
// explained and remembered, a success clears it. Permanent failures
// (a record the sink refuses for good) say nothing about reachability.
func (w *sinkWatch) wrap(s core.Sink) core.Sink {
	return relay.Wrap(s, func(ctx context.Context, batch []core.Envelope, publish relay.PublishFunc) error {
		err := publish(ctx, batch)
		if err == nil {
			w.set(nil)
			return nil
		}
		var be *core.BatchError
		if errors.As(err, &be) {
			// The relay logs the records' own errors: explain each.
			out := &core.BatchError{Failed: make(map[int]error, len(be.Failed))}
			var first error
			for i, ferr := range be.Failed {
				if !core.IsPermanent(ferr) {
					ferr = w.explain(ctx, ferr)
					if first == nil {
						first = ferr
					}
				}
				out.Failed[i] = ferr
			}
			// Some records went through: the sink answers; the rest are
			// the records' own failures, not the sink's reachability.
			if len(be.Failed) < len(batch) {
				first = nil
			}
			w.set(first)
			return out
		}
		if core.IsPermanent(err) {
			return err
		}
		err = w.explain(ctx, err)
		w.set(err)
		return err
	})
}

func (w *sinkWatch) set(err error) {
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
}

// explain names the sink, its address and key, and the likely cause of
// err: nothing listening at the address (measured by dialing it), or what
// err's text points at (credentials, TLS, a timeout).
func (w *sinkWatch) explain(ctx context.Context, err error) error {
	var cause string
	if len(w.addrs) > 0 && w.dialAny(ctx) != nil {
		cause = fmt.Sprintf("nothing accepts connections at %s: check %s and that the %s server is up", strings.Join(w.addrs, ","), w.key, w.kind)
	} else {
		msg := strings.ToLower(err.Error())
		switch {
		case strings.Contains(msg, "x509") || strings.Contains(msg, "tls") || strings.Contains(msg, "certificate"):
			cause = fmt.Sprintf("the TLS handshake failed: check sink.%s.tls.* against the server's certificate", w.kind)
		case strings.Contains(msg, "auth") || strings.Contains(msg, "sasl") || strings.Contains(msg, "permission") || strings.Contains(msg, "access refused"):
			cause = fmt.Sprintf("the server refused the credentials or the operation: check sink.%s's user, password or token and its permissions", w.kind)
		case strings.Contains(msg, "deadline") || strings.Contains(msg, "timeout") || strings.Contains(msg, "buffer limit"):
			cause = fmt.Sprintf("the server at %s accepts connections but did not answer in time: is it the %s server %s should name, and is it healthy?", strings.Join(w.addrs, ","), w.kind, w.key)
		default:
			cause = "see the error; the relay retries with backoff"
		}
	}
	return fmt.Errorf("sink %s at %s (%s): %w; likely cause: %s", w.kind, strings.Join(w.addrs, ","), w.key, err, cause)
}

// dialAny returns nil once one address accepts a TCP connection, within
// a second each.
func (w *sinkWatch) dialAny(ctx context.Context) error {
	var err error
	for _, a := range w.addrs {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		err = w.dial(dctx, a)
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

// ready is the sink's part of /readyz: something accepts connections at
// its address, and the last publish did not fail retryably.
func (w *sinkWatch) ready(ctx context.Context) error {
	if len(w.addrs) > 0 {
		if err := w.dialAny(ctx); err != nil {
			return fmt.Errorf("sink %s unreachable at %s (%s)", w.kind, strings.Join(w.addrs, ","), w.key)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lastErr != nil {
		return fmt.Errorf("the last publish failed: %w", w.lastErr)
	}
	return nil
}
