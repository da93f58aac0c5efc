package demo_test

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// countingListener counts the TCP connections the API accepted.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// loadThroughAPI runs Load against a real Posting API on a fresh ledger and
// returns how many connections the API accepted.
func loadThroughAPI(t *testing.T, cfg demo.LoadConfig) int64 {
	t.Helper()
	_, pool := pgtest.Ledger(t)
	srv, err := api.New(api.Config{}, ledgerstore.New(pool, ledgerstore.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })

	cfg.BaseURL = "http://" + inner.Addr().String()
	res, err := demo.Load(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Postings != cfg.Postings {
		t.Fatalf("committed %d postings, want %d", res.Postings, cfg.Postings)
	}
	return ln.accepted.Load()
}

// Load's own client keeps a connection per worker: a load generator that
// dials per request spends the CPU of the machine it measures on TCP
// set-ups and tear-downs, on the API's side too.
func TestLoadKeepsAConnectionPerWorker(t *testing.T) {
	const workers, postings, rate = 16, 1000, 1000
	accepted := loadThroughAPI(t, demo.LoadConfig{Postings: postings, Workers: workers, Rate: rate, KeyPrefix: "keep-"})
	// A worker may dial once more when its request races another's
	// return of a connection (net/http's dial race); it never dials per
	// request.
	if accepted > 2*workers {
		t.Errorf("the API accepted %d connections for %d workers", accepted, workers)
	}

	// Control: a client on Go's default transport, which keeps two idle
	// connections per host, makes the other workers dial again and again.
	control := loadThroughAPI(t, demo.LoadConfig{Postings: postings, Workers: workers, Rate: rate, KeyPrefix: "dial-",
		Client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}})
	if control <= 2*workers {
		t.Errorf("control: the default transport made only %d connections for %d workers", control, workers)
	}
	t.Logf("connections accepted for %d postings by %d workers: %d with Load's client, %d with the default transport", postings, workers, accepted, control)
}
