package polling_test

import (
	"errors"
	"testing"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// TestExactlyOnceRefusesASinkWithoutTransactions: exactly-once is never
// silently off; a sink that cannot publish in fenced transactions is
// refused when the relay is made.
func TestExactlyOnceRefusesASinkWithoutTransactions(t *testing.T) {
	_, err := polling.New(nil, memory.New(memory.Config{}), relay.Settings{ExactlyOnce: true})
	if !errors.Is(err, relay.ErrInvalidConfig) {
		t.Fatalf("exactly-once over the memory sink: %v, want ErrInvalidConfig", err)
	}
}
