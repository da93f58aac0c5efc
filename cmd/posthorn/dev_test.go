package main

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// startDevKafka runs `posthorn dev kafka` and returns the address from its
// ready line, which is what scripts wait for.
func startDevKafka(t *testing.T, dataDir string, flags ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := cliCommand(nil, append([]string{"dev", "kafka", "--listen", "127.0.0.1:0", "--data-dir", dataDir}, flags...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	startCLI(t, cmd)
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

// --nodes 3 is a three-broker cluster (all addresses on the ready line);
// each SIGUSR1 elects new partition leaders, which a client's metadata shows.
func TestDevKafkaNodesAndLeaderMovesOnSIGUSR1(t *testing.T) {
	cmd, addrs := startDevKafka(t, t.TempDir(), "--nodes", "3", "--partitions", "16")
	seeds := strings.Split(addrs, ",")
	if len(seeds) != 3 {
		t.Fatalf("ready line lists %q, want three addresses", addrs)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	leaders := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := kmsg.NewPtrMetadataRequest()
		topic := kmsg.NewMetadataRequestTopic()
		topic.Topic = kmsg.StringPtr("ledger.events")
		req.Topics = append(req.Topics, topic)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil || len(resp.Topics) != 1 {
			t.Fatalf("metadata: %v", err)
		}
		var b strings.Builder
		ps := resp.Topics[0].Partitions
		slices.SortFunc(ps, func(a, b kmsg.MetadataResponseTopicPartition) int { return int(a.Partition - b.Partition) })
		for _, p := range ps {
			fmt.Fprintf(&b, "%d:%d ", p.Partition, p.Leader)
		}
		return b.String()
	}
	before := leaders()
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the partition leaders to change after SIGUSR1 (were "+before+")", func() bool { return leaders() != before })
}
