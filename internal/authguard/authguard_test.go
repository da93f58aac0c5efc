package authguard

import (
	"fmt"
	"testing"
	"time"
)

func TestGuardBlocksAfterMaxFailuresForTheWindow(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_000_000, 0)
	g := New(3, time.Minute)
	g.now = func() time.Time { return clock }
	for i := 1; i <= 3; i++ {
		if _, blocked := g.Blocked("10.0.0.1"); blocked {
			t.Fatalf("blocked before failure %d", i)
		}
		n, now := g.Failed("10.0.0.1")
		if n != i || now != (i == 3) {
			t.Fatalf("failure %d: counted %d, blocked %v", i, n, now)
		}
	}
	if left, blocked := g.Blocked("10.0.0.1"); !blocked || left != time.Minute {
		t.Fatalf("after 3 failures: blocked %v for %v, want a minute", blocked, left)
	}
	if _, blocked := g.Blocked("10.0.0.2"); blocked {
		t.Fatal("another address is blocked by the first one's failures")
	}
	clock = clock.Add(time.Minute)
	if _, blocked := g.Blocked("10.0.0.1"); blocked {
		t.Fatal("still blocked after the window")
	}
	if n, _ := g.Failed("10.0.0.1"); n != 1 {
		t.Fatalf("a new window starts at %d failures, want 1", n)
	}
	// Failures spread wider than the window never block.
	for range 10 {
		clock = clock.Add(time.Minute)
		if _, blocked := g.Failed("10.0.0.3"); blocked {
			t.Fatal("one failure a minute blocked the address")
		}
	}
	var off *Guard = New(0, 0)
	if _, blocked := off.Failed("x"); blocked {
		t.Fatal("a nil guard blocked")
	}
}

func TestGuardMemoryIsBounded(t *testing.T) {
	t.Parallel()
	g := New(2, time.Minute)
	for i := range MaxAddresses + 50 {
		g.Failed(fmt.Sprintf("a%d", i))
	}
	if len(g.addrs) > MaxAddresses+1 {
		t.Fatalf("%d addresses tracked, at most %d+1", len(g.addrs), MaxAddresses)
	}
	// The untracked addresses share one count, which blocked them.
	if _, blocked := g.Blocked("a-new-one"); !blocked {
		t.Fatal("the shared count of untracked addresses does not block")
	}
	if _, blocked := g.Blocked("a0"); blocked {
		t.Fatal("a tracked address with one failure is blocked")
	}
}
