package kafka

import (
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
}

// SourceName names the source in reports.
func (s TopicSeen) SourceName() string { return "kafka " + strings.Join(s.Topics, ",") }

// Seen reads, in read-committed isolation, every record from the first at
// or after Since up to the partitions' last stable offsets as they were
// when it began (what the relay writes meanwhile is not waited for). A
// topic that does not exist holds nothing; a record that is not Posthorn's
// (no contract headers) is skipped.
func (s TopicSeen) Seen(ctx context.Context) ([]ops.SeenEvent, error) {
	if len(s.Config.Brokers) == 0 {
		return nil, errors.New("kafka: no brokers")
	}
	sec, err := s.Config.Security.kgoOpts()
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.Config.Brokers...), kgo.ClientID("posthorn-failover"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted())}, sec...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// The client retries an unreachable broker for as long as it is let:
	// listing the offsets gets seenListTimeout.
	lctx, cancel := context.WithTimeout(ctx, seenListTimeout)
	defer cancel()
	ends, err := adm.ListCommittedOffsets(lctx, s.Topics...)
	if err != nil {
		return nil, fmt.Errorf("kafka: end offsets of %v: %w", s.Topics, err)
	}
	starts, err := adm.ListStartOffsets(lctx, s.Topics...)
	if !s.Since.IsZero() && err == nil {
		starts, err = adm.ListOffsetsAfterMilli(lctx, s.Since.UnixMilli(), s.Topics...)
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: start offsets of %v: %w", s.Topics, err)
	}
	from := map[string]map[int32]kgo.Offset{}
	until := map[string]map[int32]int64{}
	var listErr error
	ends.Each(func(end kadm.ListedOffset) {
		if end.Err != nil {
			if !errors.Is(end.Err, kerr.UnknownTopicOrPartition) {
				listErr = errors.Join(listErr, fmt.Errorf("kafka: %s[%d]: %w", end.Topic, end.Partition, end.Err))
			}
			return
		}
		start, ok := starts.Lookup(end.Topic, end.Partition)
		if !ok || start.Err != nil || start.Offset < 0 || start.Offset >= end.Offset {
			return
		}
		if from[end.Topic] == nil {
			from[end.Topic], until[end.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		from[end.Topic][end.Partition] = kgo.NewOffset().At(start.Offset)
		until[end.Topic][end.Partition] = end.Offset
	})
	if listErr != nil {
		return nil, listErr
	}
	if len(from) == 0 {
		return nil, nil
	}
	cl.AddConsumePartitions(from)
	var out []ops.SeenEvent
	// The ends are last stable offsets: every record below them is
	// decided, so when none has come for seenQuiet the offsets left are
	// transaction markers (or aborted records), which no record reaches.
	progress := time.Now()
	for len(until) > 0 && time.Since(progress) < seenQuiet {
		pctx, cancel := context.WithTimeout(ctx, seenQuiet-time.Since(progress))
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				fetchErr = errors.Join(fetchErr, fmt.Errorf("kafka: read %s[%d]: %w", t, p, err))
			}
		})
		if fetchErr != nil {
			return nil, fetchErr
		}
		fetches.EachRecord(func(r *kgo.Record) {
			end, ok := until[r.Topic][r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			progress = time.Now()
			if e, ok := seenEvent(r); ok {
				out = append(out, e)
			}
			if r.Offset+1 >= end {
				delete(until[r.Topic], r.Partition)
				if len(until[r.Topic]) == 0 {
					delete(until, r.Topic)
				}
			}
		})
	}
	return out, nil
}

// seenQuiet is how long a read waits for more records below the ends;
// seenListTimeout bounds listing the offsets.
const (
	seenQuiet       = 3 * time.Second
	seenListTimeout = 30 * time.Second
)

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
