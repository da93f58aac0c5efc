package core_test

import (
	"errors"
	"testing"

	"github.com/posthorn/posthorn/core"
)

func rec(typ, id string) core.Envelope { return core.Envelope{AggregateType: typ, AggregateID: id} }

func TestBatchFailuresNilWhenNothingFailed(t *testing.T) {
	t.Parallel()
	var b core.BatchFailures
	batch := []core.Envelope{rec("acct", "a"), rec("acct", "a")}
	for i, e := range batch {
		if b.Blocked(i, e) {
			t.Fatalf("record %d blocked with no failure", i)
		}
	}
	b.HoldBack(batch)
	if err := b.Err(); err != nil {
		t.Fatalf("Err = %v, want nil", err)
	}
}

func TestBatchFailuresBlocksLaterRecordsOfAFailedAggregate(t *testing.T) {
	t.Parallel()
	b := core.BatchFailures{NotSent: "x sink: not sent", Sink: "x sink"}
	batch := []core.Envelope{rec("acct", "a"), rec("acct", "b"), rec("acct", "a"), rec("acct", "b")}
	tooBig := core.Permanent(errors.New("too big"))
	var sent []int
	for i, e := range batch {
		if b.Blocked(i, e) {
			continue
		}
		if i == 0 {
			b.Fail(i, e, tooBig)
			continue
		}
		sent = append(sent, i)
	}
	if len(sent) != 2 || sent[0] != 1 || sent[1] != 3 {
		t.Fatalf("sent %v, want [1 3]: only aggregate a is held back", sent)
	}
	var be *core.BatchError
	if !errors.As(b.Err(), &be) {
		t.Fatalf("Err = %v, want *BatchError", b.Err())
	}
	if len(be.Failed) != 2 || be.Failed[0] != tooBig {
		t.Fatalf("Failed = %v, want record 0's own error and record 2", be.Failed)
	}
	held := be.Failed[2]
	if want := "x sink: not sent: an earlier record of acct a in the batch failed"; held == nil || held.Error() != want {
		t.Fatalf("record 2: %v, want %q", held, want)
	}
	if core.IsPermanent(held) {
		t.Fatal("a held-back record must fail retryably: it can be sent once its predecessor is")
	}
}

func TestBatchFailuresHoldBackFailsSentSuccessorsOnly(t *testing.T) {
	t.Parallel()
	b := core.BatchFailures{Sink: "x sink"}
	batch := []core.Envelope{rec("acct", "a"), rec("acct", "b"), rec("acct", "a"), rec("acct", "a")}
	nack := errors.New("nacked")
	own := errors.New("own error")
	// All four were sent; record 0 failed on the broker's answer and
	// record 3 has its own error, which must be kept.
	b.Fail(0, batch[0], nack)
	b.Fail(3, batch[3], own)
	b.HoldBack(batch)
	var be *core.BatchError
	if !errors.As(b.Err(), &be) {
		t.Fatalf("Err = %v, want *BatchError", b.Err())
	}
	if len(be.Failed) != 3 {
		t.Fatalf("Failed = %v, want records 0, 2, 3", be.Failed)
	}
	if be.Failed[0] != nack || be.Failed[3] != own || b.Failed(1) != nil {
		t.Fatalf("Failed = %v: own errors replaced or record 1 failed", be.Failed)
	}
	if want := "x sink: an earlier record of acct a in the batch failed"; be.Failed[2].Error() != want {
		t.Fatalf("record 2: %v, want %q", be.Failed[2], want)
	}
}
