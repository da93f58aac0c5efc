package core

import (
	"context"
	"errors"
	"fmt"
)

// Sink is the port the relay publishes through. It is as small as
// Watermill's message.Publisher, and any Watermill publisher can be wrapped
// into one.
//
// Publish returns nil only after the broker has acknowledged every record of
// the batch durably (its own definition: Kafka acks from all in-sync
// replicas, a JetStream publish ACK, RabbitMQ confirms, a Redis XADD reply, a
// SQL commit). On error, records may or may not have reached the broker: the
// relay treats the outcome as uncertain and sends them again with the same
// event IDs. A *BatchError says which records failed; any other error means
// the whole batch failed. Publish must honour ctx cancellation.
//
// Close releases the sink's connections; Publish must not be called after it.
type Sink interface {
	Publish(ctx context.Context, batch []Envelope) error
	Close() error
}

// ErrPermanent marks a failure that retrying cannot fix: a sink's refusal
// (a record too large, an unauthorised topic), on which the relay parks the
// record's aggregate, or a consumer handler's (a payload it can never
// apply), on which the consumer parks the event as poison. Everything not
// marked permanent is retried with backoff.
var ErrPermanent = errors.New("permanent failure")

// Permanent wraps err so that IsPermanent reports true for it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

// IsPermanent is the one classifier deciding retry versus park.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// BatchError reports per-record failures of a batch. Failed maps the index
// of a record in the batch to its error; records not in Failed were ACKed.
type BatchError struct {
	Failed map[int]error
}

func (e *BatchError) Error() string {
	for i, err := range e.Failed {
		return fmt.Sprintf("%d of the batch's records failed (record %d: %v)", len(e.Failed), i, err)
	}
	return "batch failed"
}
