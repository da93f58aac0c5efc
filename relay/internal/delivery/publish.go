// Package delivery is how both relay modes hand a batch to the sink and
// read its answer: publishing (through fenced transactions in exactly-once
// mode), settling the answer into what to mark, park and retry with the
// per-aggregate ordering rule, the retry backoff, and when a record that
// keeps failing counts as stuck.
package delivery

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/posthorn/posthorn/core"
)

// PublishBatch hands batch to sink, as both relays do. When the sink
// refuses the batch as a whole for good without saying which record, it
// sends one record at a time to find it (later records of a failed
// aggregate are not sent).
func PublishBatch(ctx context.Context, sink core.Sink, batch []core.Envelope) error {
	err := sink.Publish(ctx, batch)
	if err != nil && !isBatchError(err) && core.IsPermanent(err) && len(batch) > 1 {
		err = publishEach(ctx, sink, batch)
	}
	return err
}

// PublishUntil publishes batch, the envelopes of rows, as both relays do:
// with deadline (the lease's expiry) on its context, through fences in
// exactly-once mode (carry: the rows of the marker still in flight), else
// with PublishBatch.
func PublishUntil(ctx context.Context, deadline time.Time, sink core.Sink, fences *Fences, rows []core.OutboxRow, batch []core.Envelope, carry []core.RowRef) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if fences != nil {
		return fences.Publish(ctx, rows, batch, carry)
	}
	return PublishBatch(ctx, sink, batch)
}

// publishEach sends records one at a time, holding back the later records
// of an aggregate that already failed (core.BatchFailures), and reports
// failures per record.
func publishEach(ctx context.Context, sink core.Sink, batch []core.Envelope) error {
	f := core.BatchFailures{NotSent: "not sent"}
	for i, e := range batch {
		if f.Blocked(i, e) {
			continue
		}
		if err := sink.Publish(ctx, []core.Envelope{e}); err != nil {
			if be := (*core.BatchError)(nil); errors.As(err, &be) && len(be.Failed) == 1 {
				for _, fe := range be.Failed {
					err = fe
				}
			}
			f.Fail(i, e, err)
		}
	}
	return f.Err()
}

func isBatchError(err error) bool {
	var be *core.BatchError
	return errors.As(err, &be)
}

// Settlement is what to do with a published batch given the sink's answer.
type Settlement struct {
	// Acked counts the records the sink took.
	Acked int
	// Mark holds the indexes of records to mark: ACKed, with no failed
	// predecessor of the same aggregate in the batch (a later revision is
	// never marked while an earlier one is still to be sent).
	Mark []int
	// Parks are the aggregates to park: a record of theirs failed for good.
	// Their later records in the batch are neither marked nor retried.
	Parks []core.ParkedAggregate
	// Retry holds the indexes of records to send again, in batch order: the
	// records that failed retryably and the later records of their
	// aggregates.
	Retry []int
	// Retryable is the first retryable failure, nil if none.
	Retryable error
}

// Settle classifies the sink's answer err to batch by core.IsPermanent and
// *core.BatchError; it also returns how many records the answer names as
// failed (a *core.BatchError's count, or all of batch for any other error).
func Settle(batch []core.Envelope, err error) (Settlement, int) {
	failed := map[int]error{}
	var be *core.BatchError
	switch {
	case err == nil:
	case errors.As(err, &be):
		failed = be.Failed
	default:
		for i := range batch {
			failed[i] = err
		}
	}
	// The ordering rule: once a record of an aggregate failed, its later
	// records in the batch follow that first failure (parked with it, or
	// retried with it), whatever the sink answered for them.
	var s Settlement
	firstFailure := map[core.AggregateKey]error{}
	for i, e := range batch {
		k := e.Aggregate()
		ferr, isFailed := failed[i]
		if !isFailed {
			s.Acked++
		}
		if first, ok := firstFailure[k]; ok {
			if !core.IsPermanent(first) {
				s.Retry = append(s.Retry, i)
			}
			continue
		}
		switch {
		case isFailed && core.IsPermanent(ferr):
			firstFailure[k] = ferr
			s.Parks = append(s.Parks, core.ParkedAggregate{AggregateType: e.AggregateType,
				AggregateID: e.AggregateID, EventID: e.EventID, Reason: ferr.Error()})
		case isFailed:
			firstFailure[k] = ferr
			s.Retry = append(s.Retry, i)
			if s.Retryable == nil {
				s.Retryable = ferr
			}
		default:
			s.Mark = append(s.Mark, i)
		}
	}
	return s, len(failed)
}

// NewRetry returns the relays' retry backoff: exponential from initial up
// to max, each wait randomized by half, so relays that failed together do
// not retry together.
func NewRetry(initial, max time.Duration) *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = initial
	bo.MaxInterval = max
	bo.RandomizationFactor = 0.5
	return bo
}
