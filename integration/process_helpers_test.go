package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/posthorn/posthorn/integration/faultkit"
)

// The helpers of the tests that run posthorn or a broker as a child
// process.

// posthorn is the binary the process tests run, built on first use.
var posthorn struct {
	once sync.Once
	path string
	err  error
}

// posthornBin builds the child binary once per test process (without the
// race detector: only the test process runs under -race; with the
// posthorn_unsafe tag, for the negative controls' --unsafe-* flags).
func posthornBin(t *testing.T) string {
	t.Helper()
	posthorn.once.Do(func() {
		dir, err := os.MkdirTemp("", "posthorn-fault-bin")
		if err != nil {
			posthorn.err = err
			return
		}
		posthorn.path, posthorn.err = faultkit.Build(context.Background(), dir)
	})
	if posthorn.err != nil {
		t.Fatal(posthorn.err)
	}
	return posthorn.path
}

// lockedBuffer collects a child's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	port, err := faultkit.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// freeAddr is freePort as host:port.
func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", freePort(t)) }
