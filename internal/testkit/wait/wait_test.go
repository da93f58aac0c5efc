package wait_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// For returns once the condition holds, and Until reports a condition
// that never holds as false once the deadline has passed (the failure For
// turns into t.Fatalf): the control that the wait can end without success.
func TestForAndUntil(t *testing.T) {
	var n atomic.Int32
	wait.For(t, time.Second, "three polls", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("polled %d times, want 3", n.Load())
	}
	start := time.Now()
	if wait.Until(50*time.Millisecond, func() (bool, string) { return false, "never" }) {
		t.Fatal("Until reported a condition that never holds as met")
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Fatalf("Until gave up after %s, before its deadline", took)
	}
}
