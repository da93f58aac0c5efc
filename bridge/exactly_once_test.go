package bridge_test

import (
	"errors"
	"testing"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/bridge"
)

// TestExactlyOnceRefusesASinkWithoutTransactions: exactly-once is never
// silently off; a sink that cannot publish in fenced transactions is
// refused when the relay is made.
func TestExactlyOnceRefusesASinkWithoutTransactions(t *testing.T) {
	_, err := bridge.New(nil, memory.New(memory.Config{}), bridge.Config{ExactlyOnce: true})
	if !errors.Is(err, bridge.ErrInvalidConfig) {
		t.Fatalf("exactly-once over the memory sink: %v, want ErrInvalidConfig", err)
	}
}
