package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/posthorn/posthorn/internal/testkit/faultkit"
)

// The helpers of the tests that run posthorn or a broker as a child
// process, and the package's TestMain, which removes the binary.

// posthorn is the binary the process tests run, built on first use.
var posthorn struct {
	once sync.Once
	path string
	err  error
}

// posthornBin builds the child binary once per test process (without the
// race detector: only the test process runs under -race; with the
// posthorn_unsafe tag, for the negative controls' --unsafe-* flags).
func posthornBin(t testing.TB) string {
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

// TestMain fails a run that passed but left goroutines behind, and
// removes the shared posthorn binary. sarama (the consumers' Kafka client)
// starts go-metrics' meter ticker once per process, for good. And the
// sarama control sink (the relay's old producer, kept only as the
// broker-kill drain's negative control) can leave a sarama client's
// metadata updater and broker readers running after its Close when the
// broker was SIGKILLed under it (seen in a clean-clone CI run). sarama is
// not in the relay; the consumers' subscribers are closed by
// consumers.Registry.Run (TestRunClosesTheSubscribersItMade proves it) and
// by closedAtCleanup here.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		goleak.IgnoreTopFunction("github.com/IBM/sarama.(*client).backgroundMetadataUpdater"),
		goleak.IgnoreTopFunction("github.com/IBM/sarama.(*Broker).responseReceiver"),
		goleak.Cleanup(func(code int) {
			if posthorn.path != "" {
				os.RemoveAll(filepath.Dir(posthorn.path))
			}
			os.Exit(code)
		}))
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	port, err := faultkit.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// freeAddr is freePort as host:port.
func freeAddr(t testing.TB) string { return fmt.Sprintf("127.0.0.1:%d", freePort(t)) }
