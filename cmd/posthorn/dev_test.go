package main

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// startDevKafka runs `posthorn dev kafka` and returns the address from its
// ready line, which is what scripts wait for.
func startDevKafka(t *testing.T, dataDir string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(binPath, "dev", "kafka", "--listen", "127.0.0.1:0", "--data-dir", dataDir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	const prefix = "kafka-protocol broker listening on "
	if err != nil || !strings.HasPrefix(line, prefix) {
		t.Fatalf("ready line %q, %v", line, err)
	}
	return cmd, strings.TrimSpace(strings.TrimPrefix(line, prefix))
}

func TestDevKafkaServesStopsOnSIGTERMAndKeepsItsDataDir(t *testing.T) {
	dir := t.TempDir()
	cmd, addr := startDevKafka(t, dir)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: "ledger.events", Key: []byte("acc-alice"), Value: []byte("posted")}).FirstErr()
	cl.Close()
	if err != nil {
		t.Fatalf("produce: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev kafka after SIGTERM: %v, want exit 0", err)
	}

	_, addr = startDevKafka(t, dir)
	cl, err = kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("ledger.events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("the record produced before the restart is gone")
		}
		for _, r := range fs.Records() {
			if string(r.Key) == "acc-alice" && string(r.Value) == "posted" {
				return
			}
		}
	}
}
