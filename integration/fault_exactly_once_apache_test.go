package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
)

// apacheExactlyOnceFaults are the exactly-once runs' faults on a real
// three-node Apache Kafka cluster, sized for make test: the broker outages
// are SIGKILLs of one node at a time (the transaction coordinator or a
// partition leader among them), restarted on its data directory, and the
// leader moves are preferred-leader elections after a rotation of each
// partition's replicas.
func apacheExactlyOnceFaults() faultkit.RunConfig {
	return faultkit.RunConfig{
		Postings: 3000, Rate: 150, Workers: 8,
		KillRelays: 6, Freezes: 1, Terminations: 1, BrokerOutages: 2, LeaderMoves: 2,
		RollbackEvery: 500 * time.Millisecond,
		Settle:        faultkit.SettleDelivered, DrainTimeout: 4 * time.Minute,
	}
}

// apacheLeaseTTL is the relays' lease on a real cluster: the default
// (relay.lease_ttl). A fence (InitProducerID under the shard's
// transactional ID, which waits for the coordinator to abort what the
// earlier owner left open, then a read_committed read of the positions)
// takes a real cluster seconds on a loaded machine, and a fence round ends
// at the lease's deadline: with the 2 s lease of the dev-broker runs the
// relays fenced forever and published nothing.
const apacheLeaseTTL = 10 * time.Second

// TestFaultExactlyOnceApacheKafka is TestFaultExactlyOnce on a real
// three-node Apache Kafka cluster with broker SIGKILLs, which the dev
// broker cannot recover from as Kafka does: relays SIGKILLed and frozen
// past their lease, broker nodes SIGKILLed and restarted, leaders moved;
// the records are in the cloudevents format. Three independent
// read_committed readers, franz-go, kcat (librdkafka) and Apache
// kafka-clients (the Java reader, scripts/kafka/reader, which also parses
// every record with the CloudEvents Java SDK and checks each is on the
// partition the Java partitioner computes for its key), receive every
// committed event exactly once, per key in revision order.
func TestFaultExactlyOnceApacheKafka(t *testing.T) {
	skipInShortMode(t)
	k := kafkacluster.Start(t, 3)
	k.RequireOwn(t)
	s, fig := runFaultControl(t, "exactly-once under faults with broker SIGKILLs on "+k.Name(),
		faultkit.SystemConfig{ExactlyOnce: true, Kafka: k, LeaseTTL: apacheLeaseTTL, Format: string(core.FormatCloudEvents)}, apacheExactlyOnceFaults())
	for _, f := range []string{faultkit.FaultKillRelay, faultkit.FaultFreezeRelay, faultkit.FaultBroker, faultkit.FaultLeaders} {
		if fig.Faults[f] == 0 {
			t.Errorf("fault %q was not injected", f)
		}
	}
	if !fig.Report.Clean() {
		dumpLogs(t, s)
		t.Fatalf("invariants broken under faults:\n%s", fig)
	}
	for _, w := range readWire(t, s) {
		if !w.ExactlyOnce() {
			dumpLogs(t, s)
			t.Fatalf("exactly-once broken on the wire of %s: %s", k.Name(), w)
		}
	}
	// The third reader, in another language and client: Apache
	// kafka-clients, with the CloudEvents Java SDK parsing every record.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	jw, err := s.WireJava(ctx, string(core.FormatCloudEvents))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (in %v)", jw, time.Since(began).Round(100*time.Millisecond))
	for _, bad := range []string{"missing", "repeats", "unknown", "out_of_order", "wrong_partition", "cloudevents_invalid"} {
		if jw[bad] != 0 {
			t.Errorf("the Java reader counted %s=%d (examples in java-reader.log): %s", bad, jw[bad], jw)
		}
	}
	if int64(jw["committed"]) != fig.Events || jw["records"] != jw["committed"] || jw["distinct"] != jw["committed"] || jw["cloudevents"] != jw["records"] {
		t.Errorf("the Java reader read %d records (%d distinct, %d CloudEvents) of %d committed events; the run committed %d: %s",
			jw["records"], jw["distinct"], jw["cloudevents"], jw["committed"], fig.Events, jw)
	}
}

// TestFaultExactlyOnceControlApacheKafka is its negative control: the same
// faults without exactly-once, each run on a fresh cluster, and the same
// read_committed readers receive repeats (never a loss). Up to 3 runs,
// stopping at the first with repeats (TestFaultExactlyOnceControl says
// why a run may see none).
func TestFaultExactlyOnceControlApacheKafka(t *testing.T) {
	skipInShortMode(t)
	for run := 1; run <= 3; run++ {
		repeated := false
		t.Run(fmt.Sprintf("run %d", run), func(t *testing.T) {
			k := kafkacluster.Start(t, 3)
			k.RequireOwn(t)
			s, _ := runFaultControl(t, "the same faults without exactly-once on "+k.Name(), faultkit.SystemConfig{Kafka: k, LeaseTTL: apacheLeaseTTL}, apacheExactlyOnceFaults())
			repeated = true
			for _, w := range readWire(t, s) {
				if len(w.Missing) > 0 || len(w.Unknown) > 0 {
					t.Fatalf("without exactly-once the wire may repeat, never lose or invent: %s", w)
				}
				repeated = repeated && w.Repeats > 0
			}
		})
		if repeated {
			return
		}
	}
	t.Fatal("without exactly-once 3 runs of the same faults on Apache Kafka showed no repeat on the wire: this control no longer shows what exactly-once prevents")
}
