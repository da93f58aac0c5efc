package kfakebroker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
)

// childDirEnv makes the test binary act as a broker process (see TestMain),
// so a test can kill a broker the way an operator or a crash would.
const childDirEnv = "KFAKEBROKER_TEST_CHILD_DATA_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childDirEnv); dir != "" {
		b, err := Start(Options{Listen: "127.0.0.1:0", DataDir: dir})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		fmt.Println("listening on", b.Addrs()[0])
		select {} // until killed
	}
	goleak.VerifyTestMain(m)
}

func start(t *testing.T, opts Options) *Broker {
	t.Helper()
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	b, err := Start(opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

func client(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func produce(t *testing.T, addr, topic, key, value string) *kgo.Record {
	t.Helper()
	cl := client(t, addr, kgo.AllowAutoTopicCreation())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value),
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("evt-" + key)}}}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
	cl.Close()
	return r
}

// consumeOne reads topic from the start until a record with key arrives.
func consumeOne(t *testing.T, addr, topic, key string) *kgo.Record {
	t.Helper()
	cl := client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("no record with key %q on %s within 30s", key, topic)
		}
		if err := fs.Err0(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("fetch %s: %v", topic, err)
		}
		for _, r := range fs.Records() {
			if string(r.Key) == key {
				cl.Close()
				return r
			}
		}
	}
}

func partitions(t *testing.T, addr, topic string) int {
	t.Helper()
	cl := client(t, addr)
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("metadata for %s: %+v", topic, resp.Topics)
	}
	return len(resp.Topics[0].Partitions)
}

func TestProduceAndConsumeOverASocket(t *testing.T) {
	b := start(t, Options{Partitions: 8})
	addrs := b.Addrs()
	if len(addrs) != 1 || !strings.HasPrefix(addrs[0], "127.0.0.1:") || strings.HasSuffix(addrs[0], ":0") {
		t.Fatalf("Addrs = %v, want one resolved 127.0.0.1 address", addrs)
	}
	addr := addrs[0]
	if n := partitions(t, addr, "ledger.events"); n != 8 {
		t.Errorf("seeded ledger.events has %d partitions, want 8", n)
	}

	sent := produce(t, addr, "ledger.events", "acc-alice", `{"delta":"1250"}`)
	got := consumeOne(t, addr, "ledger.events", "acc-alice")
	if string(got.Value) != string(sent.Value) || len(got.Headers) != 1 || string(got.Headers[0].Value) != "evt-acc-alice" {
		t.Errorf("consumed %q headers %v, want %q with its event_id header", got.Value, got.Headers, sent.Value)
	}

	// Command topics are not seeded: they appear on first use, with the
	// same partition count.
	produce(t, addr, "commands.payouts", "acc-bob", "execute")
	consumeOne(t, addr, "commands.payouts", "acc-bob")
	if n := partitions(t, addr, "commands.payouts"); n != 8 {
		t.Errorf("auto-created commands.payouts has %d partitions, want 8", n)
	}
}

func TestRestartOnTheSameDataDirKeepsRecords(t *testing.T) {
	dir := t.TempDir()
	b := start(t, Options{DataDir: dir})
	sent := produce(t, b.Addrs()[0], "ledger.events", "acc-alice", "v1")
	b.Close()

	b2 := start(t, Options{DataDir: dir})
	got := consumeOne(t, b2.Addrs()[0], "ledger.events", "acc-alice")
	if string(got.Value) != "v1" || got.Offset != sent.Offset || got.Partition != sent.Partition {
		t.Errorf("after restart: %q at %d/%d, want %q at %d/%d",
			got.Value, got.Partition, got.Offset, sent.Value, sent.Partition, sent.Offset)
	}
	// The log continues after the persisted records rather than restarting
	// at offset 0, which would make consumers skip or repeat.
	next := produce(t, b2.Addrs()[0], "ledger.events", "acc-alice", "v2")
	if next.Partition == sent.Partition && next.Offset <= sent.Offset {
		t.Errorf("offset after restart %d, want > %d", next.Offset, sent.Offset)
	}
}

func TestInMemoryBrokerForgetsOnRestart(t *testing.T) {
	// Negative control for the test above: without a DataDir nothing
	// survives, so that test really exercises persistence.
	b := start(t, Options{})
	produce(t, b.Addrs()[0], "ledger.events", "acc-alice", "v1")
	b.Close()
	b2 := start(t, Options{})
	cl := client(t, b2.Addrs()[0])
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = "ledger.events"
	for p := int32(0); p < DefaultPartitions; p++ {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1 // latest
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if p.Offset != 0 {
				t.Errorf("fresh in-memory broker has end offset %d on partition %d", p.Offset, p.Partition)
			}
		}
	}
}

func TestKilledBrokerKeepsAcknowledgedRecords(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening on ") {
		t.Fatalf("child broker said %q, %v", line, err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	sent := produce(t, addr, "ledger.events", "acc-carol", "acked")

	// SIGKILL: no Close, no final save. Only what kfake wrote while
	// acknowledging can survive.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true

	b := start(t, Options{DataDir: dir})
	got := consumeOne(t, b.Addrs()[0], "ledger.events", "acc-carol")
	if string(got.Value) != "acked" || got.Offset != sent.Offset {
		t.Errorf("after kill: %q at %d, want %q at %d", got.Value, got.Offset, sent.Value, sent.Offset)
	}
}

func TestOneBrokerPerDataDir(t *testing.T) {
	dir := t.TempDir()
	start(t, Options{DataDir: dir})
	b, err := Start(Options{Listen: "127.0.0.1:0", DataDir: dir})
	if !errors.Is(err, ErrDataDirInUse) {
		if b != nil {
			b.Close()
		}
		t.Fatalf("second broker on one data dir: %v, want ErrDataDirInUse", err)
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Listen: "nonsense"},
		{Listen: "127.0.0.1:notaport"},
		{Listen: "127.0.0.1:0", Partitions: -1},
	} {
		if b, err := Start(o); err == nil {
			b.Close()
			t.Errorf("Start(%+v) succeeded, want an error", o)
		}
	}
}

func TestPortInUseIsAnError(t *testing.T) {
	b := start(t, Options{})
	if b2, err := Start(Options{Listen: b.Addrs()[0]}); err == nil {
		b2.Close()
		t.Fatalf("second broker on %s started", b.Addrs()[0])
	}
}
