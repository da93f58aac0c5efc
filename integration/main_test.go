package integration

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails a run that passed but left goroutines behind, and
// removes the shared posthorn binary. sarama (the consumers' Kafka client)
// starts go-metrics' meter ticker once per process, for good.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"),
		goleak.Cleanup(func(code int) {
			if posthorn.path != "" {
				os.RemoveAll(filepath.Dir(posthorn.path))
			}
			os.Exit(code)
		}))
}
