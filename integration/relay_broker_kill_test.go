package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/saramacontrol"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// brokerKillDrain is the operator's view of the Kafka sink's ACK: a backlog
// of events in the outbox, a relay draining it to `posthorn dev kafka` on a
// data directory, the broker SIGKILLed and restarted up to kills times
// during the drain (every interval, while rows are pending). When the queue
// is empty, every event the relay marked relayed is looked up on the topic.
// It returns the events marked but absent, and how many kills landed.
func brokerKillDrain(t *testing.T, newSink func([]string) (core.Sink, error), events, kills int, every time.Duration) (lost []string, landed int) {
	t.Helper()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	if err := relaytest.Fill(ctx, pool, "kill", 2000, events/2000); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	dir := t.TempDir()
	broker := faultkit.NewProc(faultkit.ProcConfig{Name: "broker", Bin: posthornBin(t), LogDir: dir,
		Args:      []string{"dev", "kafka", "--listen", addr, "--data-dir", filepath.Join(dir, "broker-data")},
		ReadyLine: "kafka-protocol broker listening on"})
	if err := broker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	sink, err := newSink([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	r := startRelay(t, pool, sink, relay.Settings{
		Owner: "kill-drain", SinkName: "kafka", Logger: relayQuietLog, Registerer: prometheus.NewRegistry(),
		RetryInitial: 20 * time.Millisecond, RetryMax: 500 * time.Millisecond,
	})
	defer r.Stop(ctx)
	pending := func() int { return relaytest.Unrelayed(t, pool) }
	for range kills {
		time.Sleep(every) // the pace of the fault, not a synchronisation
		if pending() == 0 {
			break // drained: a kill now would prove nothing
		}
		landed++
		broker.Kill()
		if err := broker.Start(ctx); err != nil {
			t.Fatalf("restart broker: %v\n%s", err, faultkit.Tail(broker.LogPath(), 20))
		}
	}
	wait.For(t, 5*time.Minute, "the relay to drain the backlog", func() bool { return pending() == 0 })
	lost, err = faultkit.RelayedNotOnBroker(ctx, pool, addr)
	if err != nil {
		t.Fatal(err)
	}
	return lost, landed
}

// brokerKillShape is the backlog, the kills and their pace: make test
// drains 100,000 events through 6 kills 0.4 s apart; the soak the size of
// the defect report, 400,000 events and 10 kills, 0.8 s apart (the
// in-process relay drains faster than the relay process of the report did,
// so the kills come closer to land during the drain).
func brokerKillShape() (events, kills int, every time.Duration) {
	if os.Getenv("POSTHORN_SOAK") != "" {
		return 400_000, 10, 800 * time.Millisecond
	}
	return 100_000, 6, 400 * time.Millisecond
}

// TestRelayDrainThroughBrokerKills: no event the relay marked relayed is
// missing from the broker after SIGKILLs of the broker mid-drain. Its
// negative control follows.
func TestRelayDrainThroughBrokerKills(t *testing.T) {
	if testing.Short() {
		t.Skip("drains a backlog through broker SIGKILLs")
	}
	t.Parallel()
	events, kills, every := brokerKillShape()
	lost, landed := brokerKillDrain(t, kafkaSink, events, kills, every)
	t.Logf("kafka sink (kgo): %d events, %d broker SIGKILLs while draining: %d marked relayed but not on the broker", events, landed, len(lost))
	if landed < kills/2 {
		t.Fatalf("only %d kills landed while the relay was draining", landed)
	}
	if len(lost) > 0 {
		t.Fatalf("%d events marked relayed are not on the broker, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
}

// TestRelayDrainThroughBrokerKillsSaramaControl is the negative control
// of the test above: the sarama idempotent sink Posthorn shipped before, in
// the same scenario, marks events relayed that the broker never stored. It
// lost events in 5 of 5 runs at make test's size when this was written, on
// a loaded machine; on a quiet one it lost nothing in 3 runs once (a clean
// CI run of 2026-12-01) and lost in the first run twice after. It stops at
// its first loss, and fails only if none of 6 runs lost anything (then the
// kill test could not tell a broken ACK from a sound one). The
// soak runs it POSTHORN_SOAK_CONTROL_RUNS times (default 5) at full size and
// reports how often it lost.
func TestRelayDrainThroughBrokerKillsSaramaControl(t *testing.T) {
	if testing.Short() {
		t.Skip("drains a backlog through broker SIGKILLs")
	}
	t.Parallel()
	soak := os.Getenv("POSTHORN_SOAK") != ""
	runs := 6
	if soak {
		runs = envInt("POSTHORN_SOAK_CONTROL_RUNS", 5)
	}
	events, kills, every := brokerKillShape()
	lossy := 0
	for i := range runs {
		lost, landed := brokerKillDrain(t, func(b []string) (core.Sink, error) { return saramacontrol.New(b) }, events, kills, every)
		t.Logf("sarama control run %d: %d events, %d broker SIGKILLs while draining: %d marked relayed but not on the broker", i+1, events, landed, len(lost))
		if len(lost) > 0 {
			lossy++
			if !soak {
				break
			}
		}
	}
	t.Logf("sarama control: %d of the runs lost events", lossy)
	if lossy == 0 {
		t.Fatalf("the sarama sink lost nothing in %d runs: the broker-kill drain cannot tell a broken ACK from a sound one", runs)
	}
}
