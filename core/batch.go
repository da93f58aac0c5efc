package core

import "fmt"

// BatchFailures keeps a sink's per-record failures while it publishes a
// batch, and holds back the later records of an aggregate whose earlier
// record failed: a later revision must never be stored or reported ACKed
// ahead of an earlier one. The zero value is ready to use; the two
// prefixes only shape the errors BatchFailures makes itself.
type BatchFailures struct {
	// NotSent starts the error of a record held back before sending, e.g.
	// "nats sink: not sent" gives "nats sink: not sent: an earlier record
	// of T ID in the batch failed".
	NotSent string
	// Sink starts the error of a record that was sent but follows a failed
	// record of its aggregate (see HoldBack), e.g. "nats sink".
	Sink string

	failed  map[int]error
	blocked map[AggregateKey]bool
}

// Blocked reports whether an earlier record of e's aggregate failed; if so
// it records for record i the retryable error that it was not sent.
func (b *BatchFailures) Blocked(i int, e Envelope) bool {
	if !b.blocked[e.Aggregate()] {
		return false
	}
	b.set(i, fmt.Errorf("%s: an earlier record of %s %s in the batch failed", b.NotSent, e.AggregateType, e.AggregateID))
	return true
}

// Fail records err for record i (replacing an earlier error of i) and
// blocks the later records of e's aggregate.
func (b *BatchFailures) Fail(i int, e Envelope, err error) {
	b.set(i, err)
	if b.blocked == nil {
		b.blocked = map[AggregateKey]bool{}
	}
	b.blocked[e.Aggregate()] = true
}

// Failed returns record i's error, nil if it has none.
func (b *BatchFailures) Failed(i int) error { return b.failed[i] }

// HoldBack fails, after sending, every record of batch with no error of its
// own that follows a failed record of its aggregate: it may be stored, but
// it is not reported ACKed, so its marker cannot come before its
// predecessor's.
func (b *BatchFailures) HoldBack(batch []Envelope) {
	failedAgg := map[AggregateKey]bool{}
	for i, e := range batch {
		a := e.Aggregate()
		if failedAgg[a] && b.failed[i] == nil {
			b.set(i, fmt.Errorf("%s: an earlier record of %s %s in the batch failed", b.Sink, e.AggregateType, e.AggregateID))
		}
		if b.failed[i] != nil {
			failedAgg[a] = true
		}
	}
}

// Err returns nil if no record failed, else a *BatchError with every
// record's error.
func (b *BatchFailures) Err() error {
	if len(b.failed) == 0 {
		return nil
	}
	return &BatchError{Failed: b.failed}
}

func (b *BatchFailures) set(i int, err error) {
	if b.failed == nil {
		b.failed = map[int]error{}
	}
	b.failed[i] = err
}
