package postgres

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultTCPUserTimeout is how long data sent to the server may stay
// unacknowledged before the connection is given up, unless the URL's
// tcp_user_timeout says otherwise (libpq's parameter, in milliseconds; 0
// leaves the operating system's, about 15 minutes on Linux). A server that
// is slow still acknowledges what it receives, so only a network that stops
// carrying the server's packets (a partition, a dropped route, a host gone
// without a reset) trips it: the statement then fails instead of waiting
// for the operating system, and the caller's retry takes a new connection.
// A transaction whose COMMIT was sent has an unknown outcome then, which
// every writer of Posthorn's already allows for (the inbox's event IDs, the
// relay's fenced markers).
const DefaultTCPUserTimeout = 20 * time.Second

// keepAlive probes an idle connection (one waiting for a reply counts)
// after 5 s of silence, every 5 s: a probe is sent data, so a server that
// stopped answering is found by the user timeout even while nothing else
// is sent.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 3}

// dialWithUserTimeout sets cfg's dialer to one that bounds how long the
// server may stay silent (tcp_user_timeout, taken out of the parameters
// sent to the server, where it would set the server's side instead).
func dialWithUserTimeout(cfg *pgconn.Config) error {
	timeout := DefaultTCPUserTimeout
	if v, ok := cfg.RuntimeParams["tcp_user_timeout"]; ok {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 {
			return fmt.Errorf("database URL: tcp_user_timeout: is %q, want milliseconds, 0 or more", v)
		}
		timeout = time.Duration(ms) * time.Millisecond
		delete(cfg.RuntimeParams, "tcp_user_timeout")
	}
	d := &net.Dialer{KeepAliveConfig: keepAlive, Control: userTimeoutControl(timeout)}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	return nil
}
