package consumers

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/cenkalti/backoff/v5"
)

// retrying retries a handler that failed as r says (Watermill's Retry
// fields: MaxRetries, InitialInterval, Multiplier, MaxInterval,
// RandomizationFactor, MaxElapsedTime, ResetContextOnRetry, Logger), each
// wait computed by cenkalti/backoff's exponential backoff, and never an
// error shouldRetry refuses. Watermill's own Retry middleware builds its
// backoff and five closures for every message before the first attempt:
// 13 of the 66 allocations a message cost the consumers' Kafka path. This
// one allocates nothing until a message has failed. The waits are
// InitialInterval, then times Multiplier up to MaxInterval (Watermill's
// middleware takes two steps of its backoff per failure when ShouldRetry
// is set, so its waits grew twice as fast).
func retrying(r middleware.Retry, shouldRetry func(error) bool) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil || r.MaxRetries <= 0 || !shouldRetry(err) {
				return out, err
			}
			return retryFailed(r, shouldRetry, h, msg, err)
		}
	}
}

// retryFailed retries msg, whose first attempt failed with err.
func retryFailed(r middleware.Retry, shouldRetry func(error) bool, h message.HandlerFunc, msg *message.Message, err error) ([]*message.Message, error) {
	ctx := msg.Context()
	b := &backoff.ExponentialBackOff{InitialInterval: r.InitialInterval, RandomizationFactor: r.RandomizationFactor,
		Multiplier: r.Multiplier, MaxInterval: r.MaxInterval}
	b.Reset()
	started := time.Now()
	for retry := 1; retry <= r.MaxRetries; retry++ {
		wait := b.NextBackOff()
		if r.MaxElapsedTime > 0 && time.Since(started)+wait > r.MaxElapsedTime {
			break
		}
		if r.Logger != nil {
			r.Logger.Error("Error occurred, retrying", err, watermill.LogFields{"retry_no": retry, "max_retries": r.MaxRetries, "wait_time": wait})
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		if r.ResetContextOnRetry {
			msg.SetContext(ctx)
		}
		var out []*message.Message
		if out, err = h(msg); err == nil || !shouldRetry(err) {
			return out, err
		}
	}
	return nil, err
}
