package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// TopicSeen is what Kafka holds, for the failover check: every committed
// record of Topics written since Since, read by its contract headers (which
// every wire format carries). Records are whole, so a lost posting can be
// rebuilt from the sink even where no consumer kept its payload.
type TopicSeen struct {
	// Config gives the brokers and their security; its producer settings
	// are not used.
	Config Config
	Topics []string
	// Since bounds the read by record timestamp; the zero time reads each
	// partition from its start.
	Since time.Time
	// Wait bounds the wait for a leader election or an open transaction
	// before the read begins; default 30 s.
	Wait time.Duration
}

// SourceName names the source in reports.
func (s TopicSeen) SourceName() string { return "kafka " + strings.Join(s.Topics, ",") }

// Seen reads, in read-committed isolation, every record from the first at
// or after Since up to the partitions' last stable offsets as they were
// when it began (what the relay writes meanwhile is not waited for), and
// hands them to each ops.SeenBatch or fewer at a time. A topic that does
// not exist holds nothing; a record that is not Posthorn's (no contract
// headers) is skipped.
func (s TopicSeen) Seen(ctx context.Context, each func([]ops.SeenEvent) error) error {
	if len(s.Config.Brokers) == 0 {
		return errors.New("kafka: no brokers")
	}
	sec, err := s.Config.Security.kgoOpts()
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.Config.Brokers...), kgo.ClientID("posthorn-failover"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted())}, sec...)...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// The client retries an unreachable broker for as long as it is let:
	// listing the offsets gets seenListTimeout, and is asked again while a
	// partition answers a retriable error (a leader election in progress).
	lctx, cancel := context.WithTimeout(ctx, cmp.Or(s.Wait, seenListTimeout))
	defer cancel()
	var ends, starts kadm.ListedOffsets
	var open []string
	for {
		e, st, o, err := s.listOffsets(lctx, adm)
		var code *kerr.Error
		if err == nil {
			ends, starts, open = e, st, o
			if len(open) == 0 {
				break
			}
		} else if lctx.Err() == nil && !(errors.As(err, &code) && code.Retriable) {
			return err
		}
		if lctx.Err() != nil {
			if len(open) > 0 {
				// Records past an open transaction are not decided yet:
				// reading up to it would leave them out without a word.
				return fmt.Errorf("kafka: %s hold a transaction still open after %s (records past it are not decided yet); run the check again once it ends (the producer's transaction timeout)",
					strings.Join(open, ", "), cmp.Or(s.Wait, seenListTimeout))
			}
			return cmp.Or(err, lctx.Err())
		}
		time.Sleep(200 * time.Millisecond) // an election, or a transaction, is under way
	}
	from := map[string]map[int32]kgo.Offset{}
	until := map[string]map[int32]int64{}
	ends.Each(func(end kadm.ListedOffset) {
		start, ok := starts.Lookup(end.Topic, end.Partition)
		if end.Err != nil || !ok || start.Offset < 0 || start.Offset >= end.Offset {
			return
		}
		if from[end.Topic] == nil {
			from[end.Topic], until[end.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		from[end.Topic][end.Partition] = kgo.NewOffset().At(start.Offset)
		until[end.Topic][end.Partition] = end.Offset
	})
	if len(from) == 0 {
		return nil
	}
	cl.AddConsumePartitions(from)
	batch := make([]ops.SeenEvent, 0, ops.SeenBatch)
	// The ends are last stable offsets: every record below them is
	// decided, so when none has come for seenQuiet the offsets left are
	// transaction markers (or aborted records), which no record reaches.
	progress := time.Now()
	for len(until) > 0 && time.Since(progress) < seenQuiet {
		pctx, cancel := context.WithTimeout(ctx, seenQuiet-time.Since(progress))
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				fetchErr = errors.Join(fetchErr, fmt.Errorf("kafka: read %s[%d]: %w", t, p, err))
			}
		})
		if fetchErr != nil {
			return fetchErr
		}
		fetches.EachRecord(func(r *kgo.Record) {
			end, ok := until[r.Topic][r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			progress = time.Now()
			if e, ok := seenEvent(r); ok {
				batch = append(batch, e)
			}
			if r.Offset+1 >= end {
				delete(until[r.Topic], r.Partition)
				if len(until[r.Topic]) == 0 {
					delete(until, r.Topic)
				}
			}
		})
		for len(batch) >= ops.SeenBatch {
			if err := each(batch[:ops.SeenBatch:ops.SeenBatch]); err != nil {
				return err
			}
			batch = batch[ops.SeenBatch:]
			// The time each took is not time waited for a record.
			progress = time.Now()
		}
	}
	if len(batch) > 0 {
		return each(batch)
	}
	return nil
}

// seenQuiet is how long a read waits for more records below the ends;
// seenListTimeout bounds listing the offsets.
const (
	seenQuiet       = 3 * time.Second
	seenListTimeout = 30 * time.Second
)

// listOffsets lists the topics' last stable offsets, the first offsets at
// or after Since (the start, when Since is zero), and the partitions whose
// last stable offset is behind their end (an open transaction). A topic
// that does not exist is left out; any other partition's error is
// returned (wrapping its *kerr.Error).
func (s TopicSeen) listOffsets(ctx context.Context, adm *kadm.Client) (ends, starts kadm.ListedOffsets, open []string, err error) {
	ends, err = adm.ListCommittedOffsets(ctx, s.Topics...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kafka: end offsets of %v: %w", s.Topics, err)
	}
	hw, err := adm.ListEndOffsets(ctx, s.Topics...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kafka: end offsets of %v: %w", s.Topics, err)
	}
	if s.Since.IsZero() {
		starts, err = adm.ListStartOffsets(ctx, s.Topics...)
	} else {
		starts, err = adm.ListOffsetsAfterMilli(ctx, s.Since.UnixMilli(), s.Topics...)
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kafka: start offsets of %v: %w", s.Topics, err)
	}
	for _, l := range []kadm.ListedOffsets{ends, hw, starts} {
		var perr error
		l.Each(func(o kadm.ListedOffset) {
			if o.Err != nil && !errors.Is(o.Err, kerr.UnknownTopicOrPartition) && perr == nil {
				perr = fmt.Errorf("kafka: offsets of %s[%d]: %w", o.Topic, o.Partition, o.Err)
			}
		})
		if perr != nil {
			return nil, nil, nil, perr
		}
	}
	hw.Each(func(o kadm.ListedOffset) {
		if st, ok := ends.Lookup(o.Topic, o.Partition); ok && st.Err == nil && st.Offset < o.Offset {
			open = append(open, fmt.Sprintf("%s[%d]", o.Topic, o.Partition))
		}
	})
	return ends, starts, open, nil
}

// seenEvent decodes r by its contract headers.
func seenEvent(r *kgo.Record) (ops.SeenEvent, bool) {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	e, err := core.EnvelopeFromHeaders(h, r.Value)
	if err != nil {
		return ops.SeenEvent{}, false
	}
	return ops.SeenEvent{EventID: e.EventID, Kind: string(e.Kind), Type: e.Type, AggregateType: e.AggregateType,
		AggregateID: e.AggregateID, Revision: e.Revision, JournalID: e.JournalID, Payload: e.Payload, Headers: h}, true
}
