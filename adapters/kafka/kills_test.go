package kafka_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/saramacontrol"
	"github.com/posthorn/posthorn/adapters/kfakebroker/kfakeproc"
	"github.com/posthorn/posthorn/adapters/sinktest"
	"github.com/posthorn/posthorn/core"
)

// TestKfakeBrokerProcess is the broker process of the kill tests (this
// test binary started again by kfakeproc.Start); it skips otherwise.
func TestKfakeBrokerProcess(t *testing.T) { kfakeproc.ServeIfChild(t) }

// killHarness is the harness of the broker-kill case: a kfake broker in a
// process of its own on a data directory, SIGKILLed and started again on
// the same port and directory, and a sink built by newSink on it.
func killHarness(t *testing.T, newSink func(brokers []string) (core.Sink, error)) sinktest.Harness {
	b := kfakeproc.Start(t, "TestKfakeBrokerProcess")
	s, err := newSink([]string{b.Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return sinktest.Harness{
		Sink:  s,
		Read:  ReadFunc([]string{b.Addr}),
		Keyed: true,
		Kill:  func(*testing.T) func() { return b.Kill() },
	}
}

func newKafkaSink(brokers []string) (core.Sink, error) {
	return kafka.New(kafka.Config{Brokers: brokers})
}

func newSaramaControl(brokers []string) (core.Sink, error) { return saramacontrol.New(brokers) }

// TestBrokerKillsSaramaControlShort is the short negative control of the
// broker-kill case in make test: with the old sarama sink the case's
// conformance checks fail under the same kills: records ACKed after an
// earlier record of their key failed, ACKed records on the broker after a
// later revision of their key, or ACKed records absent. Loss alone shows
// up in some runs only (TestBrokerKillsSaramaControl measures how often),
// so this control wants any of the three, in at most 3 runs.
func TestBrokerKillsSaramaControlShort(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a broker process")
	}
	for i := 1; i <= 3; i++ {
		var r sinktest.KillReport
		t.Run("run"+strconv.Itoa(i), func(t *testing.T) {
			r = sinktest.MeasureKills(t, killHarness(t, newSaramaControl), sinktest.KillOptions{})
		})
		if r.Absent+r.OutOfOrder+r.Overtaken > 0 {
			t.Logf("the sarama control failed the broker-kill case in run %d: %d ACKed but absent, %d out of order, %d overtaken", i, r.Absent, r.OutOfOrder, r.Overtaken)
			return
		}
	}
	t.Errorf("the sarama control passed the broker-kill case 3 times: the case did not see the defect it exists to catch")
}

// TestBrokerKillsSaramaControl is the negative control of the broker-kill
// case: the sink Posthorn shipped before (sarama's idempotent producer)
// under the same kills reports records ACKed that the broker never stored
// (issue 13). It does so in some runs only (2 of 6 runs of 75 s with 12
// kills, field notes), too rarely for make test, so it runs in make soak
// (POSTHORN_SOAK=1): POSTHORN_KAFKA_CONTROL_RUNS runs (default 6) of
// POSTHORN_KAFKA_CONTROL_DURATION (default 75s) each, 1,000-record
// batches, a kill every few seconds; it fails if no run lost anything (the
// kill case could then not be shown to see this loss).
func TestBrokerKillsSaramaControl(t *testing.T) {
	if os.Getenv("POSTHORN_SOAK") == "" {
		t.Skip("the sarama control loses records in some long runs only: make soak runs it (POSTHORN_SOAK=1)")
	}
	runs := 6
	if v := os.Getenv("POSTHORN_KAFKA_CONTROL_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("POSTHORN_KAFKA_CONTROL_RUNS=%q: want a positive number", v)
		}
		runs = n
	}
	d := 75 * time.Second
	if v := os.Getenv("POSTHORN_KAFKA_CONTROL_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("POSTHORN_KAFKA_CONTROL_DURATION=%q: %v", v, err)
		}
	}
	lost, lossy := 0, 0
	for i := 1; i <= runs; i++ {
		var r sinktest.KillReport
		t.Run("run"+strconv.Itoa(i), func(t *testing.T) {
			r = sinktest.MeasureKills(t, killHarness(t, newSaramaControl), sinktest.KillOptions{
				Kills: 12, Duration: d, BatchSize: 1000, Keys: 200, Up: d / 13,
			})
		})
		if r.Absent > 0 {
			lossy++
			lost += r.Absent
		}
		t.Logf("sarama control run %d of %d: %d kills, %d ACKed, %d ACKed but absent, %d out of order", i, runs, r.Kills, r.Acked, r.Absent, r.OutOfOrder)
	}
	t.Logf("sarama control: %d of %d runs of %v lost ACKed records (%d in all)", lossy, runs, d, lost)
	if lossy == 0 {
		t.Errorf("the sarama control lost nothing in %d runs of %v: the broker-kill case did not show the loss it exists to catch", runs, d)
	}
}
