package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay/cdc"
	"github.com/posthorn/posthorn/relay/polling"
)

// newExactlyOnceSink is the Kafka sink in exactly-once mode on brokers,
// with the test relays' short dial and retry timings.
func newExactlyOnceSink(t *testing.T, brokers []string) *kafka.ExactlyOnceSink {
	t.Helper()
	return sinktest.Open(t, kafka.NewExactlyOnce, kafka.Config{Brokers: brokers, ClientOpts: testKafkaOpts()})
}

// ackThenCrash posts events, lets an exactly-once relay crash right after
// the broker committed its first batch (no marker), and starts a second
// relay, with hooks, that drains the outbox. It returns the posted events
// and how often a read_committed reader received each, in the order read.
func ackThenCrash(t *testing.T, hooks *polling.Hooks) ([]relaytest.Posted, map[string]int, []*kgo.Record) {
	t.Helper()
	_, pool := pgtest.Ledger(t)
	b := startRelayBroker(t)
	posted := relaytest.MustPostTransfers(t, pool, 60, 11, 3)
	crashed, _ := startTestRelay(t, pool, newExactlyOnceSink(t, b.addrs), "relay-crashing", "kafka",
		&polling.Hooks{AfterAck: func([]core.Envelope) error { return errors.New("crash after the commit") }})
	<-crashed.Stopped()
	if n := relaytest.Unrelayed(t, pool); n != len(posted) {
		t.Fatalf("after a crash before the marker %d rows are unrelayed, want all %d", n, len(posted))
	}
	startTestRelay(t, pool, newExactlyOnceSink(t, b.addrs), "relay-next", "kafka", hooks)
	wait.For(t, 30*time.Second, "the outbox drained", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	recs := kafkatest.MustReadTopic(t, b.addrs, core.TopicEvents, true)
	count := map[string]int{}
	for _, r := range recs {
		count[kafkatest.Header(r, core.HeaderEventID)]++
	}
	return posted, count, recs
}

// TestRelayExactlyOnceAckThenCrash: the relay crashes after its
// transaction committed and before the marker; the next relay fences the
// shards, reads the positions and marks what was committed, so a
// read_committed reader receives every event exactly once, per account in
// revision order. (Without exactly-once the same crash sends the batch
// again: relay/polling's TestCrashAfterAckBeforeMarkerResends.)
func TestRelayExactlyOnceAckThenCrash(t *testing.T) {
	t.Parallel()
	posted, count, recs := ackThenCrash(t, nil)
	for _, p := range posted {
		if count[p.EventID] != 1 {
			t.Fatalf("event %s read %d times by a read_committed reader, want once", p.EventID, count[p.EventID])
		}
	}
	if len(recs) != len(posted) {
		t.Fatalf("read %d records, want %d", len(recs), len(posted))
	}
	last := map[string]int64{}
	for _, r := range recs {
		rev, err := strconv.ParseInt(kafkatest.Header(r, core.HeaderRevision), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if prev := last[string(r.Key)]; rev <= prev {
			t.Fatalf("account %s: revision %d after %d", r.Key, rev, prev)
		}
		last[string(r.Key)] = rev
	}
}

// TestRelayExactlyOnceControlWithoutPositions is the negative control of
// the positions read: the next relay fences but does not mark what the
// committed transactions hold (Hooks.UnsafeSkipPositions), and the
// read_committed reader receives the crashed batch twice.
func TestRelayExactlyOnceControlWithoutPositions(t *testing.T) {
	t.Parallel()
	posted, count, _ := ackThenCrash(t, &polling.Hooks{UnsafeSkipPositions: true})
	repeats := 0
	for _, p := range posted {
		repeats += count[p.EventID] - 1
	}
	if repeats == 0 {
		t.Fatal("without the positions read the committed batch was not sent again: this control no longer shows the repeat")
	}
	t.Logf("without the positions read: %d repeats of %d events", repeats, len(posted))
}

// TestRelayExactlyOnceResendStillSends: with exactly-once on, a resend
// still sends on purpose: outside any transaction, with the resend header,
// and a read_committed reader receives it beside the relay's committed
// record.
func TestRelayExactlyOnceResendStillSends(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	b := startRelayBroker(t)
	posted := relaytest.MustPost(t, pool, "acc-resend-a", "acc-resend-b")
	sink := newExactlyOnceSink(t, b.addrs)
	startTestRelay(t, pool, sink, "relay-resend", "kafka")
	wait.For(t, 30*time.Second, "the outbox drained", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	ctx := context.Background()
	res, err := ops.Resend(ctx, ops.ResendConfig{Ledger: opsstore.New(pool), Sink: sink, EventIDs: []string{posted[0].EventID}})
	if err != nil || res.Sent != 1 {
		t.Fatalf("resend: %+v, %v", res, err)
	}
	recs := kafkatest.MustReadTopic(t, b.addrs, core.TopicEvents, true)
	var copies, resent int
	for _, r := range recs {
		if kafkatest.Header(r, core.HeaderEventID) == posted[0].EventID {
			copies++
			if kafkatest.Header(r, core.HeaderResend) == "true" {
				resent++
			}
		}
	}
	if copies != 2 || resent != 1 || len(recs) != len(posted)+1 {
		t.Fatalf("read_committed reader: %d copies of the resent event (%d with the resend header), %d records; want 2, 1, %d", copies, resent, len(recs), len(posted)+1)
	}
}

// TestCDCRelayExactlyOnceThroughOutageAndCrash: two CDC relays in
// exactly-once mode, a broker outage, then the slot's reader crashes after
// its transaction committed and before the marker; the standby takes the
// slot over, fences, marks what was committed and catches up. A
// read_committed reader receives every committed event exactly once, per
// account in revision order. The control fences without marking what the
// positions hold (UnsafeSkipPositions): the crashed batch arrives twice.
func TestCDCRelayExactlyOnceThroughOutageAndCrash(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control %v", control), func(t *testing.T) {
			t.Parallel()
			pool := cdcLedger(t)
			broker := startRelayBroker(t)
			armed, crash := crashOnce("crash after the commit") // cdc_kafka_test.go
			hooks := &cdc.Hooks{UnsafeSkipPositions: control, AfterAck: crash}
			a := startCDCRelay(t, pool, broker.addrs, "relay-a", hooks, true)
			b := startCDCRelay(t, pool, broker.addrs, "relay-b", hooks, true)
			tr := &transfers{t: t, pool: pool, accounts: 7, step: 3}
			tr.post(10)
			wait.For(t, 30*time.Second, "the first events relayed", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
			broker.stop()
			tr.post(10)
			broker.restart()
			wait.For(t, 60*time.Second, "delivery after the outage", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
			armed.Store(true)
			tr.post(20)
			wait.For(t, 30*time.Second, "the reader to crash", func() bool { return a.Crashed() || b.Crashed() })
			tr.post(10)
			wait.For(t, 60*time.Second, "every event relayed", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
			recs := kafkatest.MustReadTopic(t, broker.addrs, core.TopicEvents, true)
			count := map[string]int{}
			last := map[string]int64{}
			for _, r := range recs {
				count[kafkatest.Header(r, core.HeaderEventID)]++
				rev, _ := strconv.ParseInt(kafkatest.Header(r, core.HeaderRevision), 10, 64)
				if !control && rev != last[string(r.Key)]+1 {
					t.Fatalf("account %s: revision %d after %d on the wire", r.Key, rev, last[string(r.Key)])
				}
				last[string(r.Key)] = max(last[string(r.Key)], rev)
			}
			repeats := len(recs) - len(count)
			for _, p := range tr.posted {
				if count[p.EventID] == 0 {
					t.Fatalf("committed event %s not on the wire", p.EventID)
				}
			}
			switch {
			case !control && repeats > 0:
				t.Fatalf("exactly-once CDC relay: %d repeats among %d records for %d events", repeats, len(recs), len(tr.posted))
			case control && repeats == 0:
				t.Fatal("without the positions read the crashed batch was not sent again: this control no longer shows the repeat")
			}
			t.Logf("%d events, %d records, %d repeats", len(tr.posted), len(recs), repeats)
		})
	}
}
