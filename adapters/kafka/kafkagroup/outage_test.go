package kafkagroup_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

const outageTopic = "ledger.events"

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestKafkaOutageHelper is not a test: run as a child process by
// TestKafkaConsumerSurvivesBrokerRestart (POSTHORN_OUTAGE_HELPER=addr), it
// is one consumer instance that prints every message ID it acks, so the
// parent can SIGKILL it like a crashed `posthorn consume`.
func TestKafkaOutageHelper(t *testing.T) {
	addr := os.Getenv("POSTHORN_OUTAGE_HELPER")
	if addr == "" {
		t.Skip("helper process only")
	}
	sc := kafkagroup.SaramaConfig()
	if d := os.Getenv("POSTHORN_OUTAGE_REBALANCE_TIMEOUT"); d != "" {
		sc.Consumer.Group.Rebalance.Timeout, _ = time.ParseDuration(d)
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: []string{addr}, Unmarshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc, ConsumerGroup: "audit-log"}, outageLogger())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(context.Background(), outageTopic)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(os.Stdout)
	for m := range ch {
		fmt.Fprintln(w, "GOT", m.UUID)
		_ = w.Flush()
		m.Ack()
	}
}

type seen struct {
	mu  sync.Mutex
	ids map[string]int
}

func (s *seen) add(id string) {
	s.mu.Lock()
	s.ids[id]++
	s.mu.Unlock()
}

func (s *seen) missing(want []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, id := range want {
		if s.ids[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// TestKafkaConsumerSurvivesBrokerRestart runs two instances of consumer
// group audit-log as separate processes (KafkaSaramaConfig, as `posthorn
// consume` reads) while messages are published: the broker is closed and
// restarted on the same port and data directory, then each instance is
// SIGKILLed and replaced (a dead member stays in the group until its
// session times out). Every message published must reach an instance
// within 60 s of the end of the load (a liveness bound with room for a loaded
// CI machine: the current settings delivered everything in 6-31 s here).
//
// Negative control (manual, not deterministic):
// POSTHORN_OUTAGE_REBALANCE_TIMEOUT=60s runs the instances with the
// rebalance timeout sarama had before the 10 s setting; the group then
// stalls in JoinGroup read timeouts and the test failed 2 of 3 runs.
func TestKafkaConsumerSurvivesBrokerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns consumer processes and restarts a broker")
	}
	dir := t.TempDir()
	addr := freeAddr(t)
	b, err := kfakebroker.Start(kfakebroker.Options{Listen: addr, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { b.Close() }()

	got := &seen{ids: map[string]int{}}
	var procs sync.Map
	start := func(name string) *exec.Cmd {
		_ = name
		cmd := exec.Command(os.Args[0], "-test.run=^TestKafkaOutageHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "POSTHORN_OUTAGE_HELPER="+addr)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs.Store(name, cmd)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if id, ok := strings.CutPrefix(sc.Text(), "GOT "); ok {
					got.add(id)
				}
			}
			_ = cmd.Wait()
		}()
		return cmd
	}
	defer procs.Range(func(_, v any) bool { _ = v.(*exec.Cmd).Process.Kill(); return true })
	kill := func(c *exec.Cmd) { _ = c.Process.Signal(syscall.SIGKILL) }

	c1 := start("c1")
	c2 := start("c2")

	var mu sync.Mutex
	var ids []string
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan struct{})
	go func() {
		defer close(pdone)
		var pub *kafka.Publisher
		for i := 0; pctx.Err() == nil; i++ {
			if pub == nil {
				pub, err = kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{addr}, Marshaler: kafka.DefaultMarshaler{}}, watermill.NopLogger{})
				if err != nil {
					pub = nil
					time.Sleep(200 * time.Millisecond) // the broker is down: the publisher's retry pace
					continue
				}
			}
			id := fmt.Sprintf("m-%d", i)
			if err := pub.Publish(outageTopic, message.NewMessage(id, []byte("{}"))); err != nil {
				_ = pub.Close()
				pub = nil
				continue
			}
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // pacing the load, not synchronisation
		}
		if pub != nil {
			_ = pub.Close()
		}
	}()
	// The sleeps below pace the fault (load, outage, restarts under load);
	// nothing waits on them: the delivery check after them is the wait.
	time.Sleep(3 * time.Second)
	b.Close()
	time.Sleep(3 * time.Second)
	b, err = kfakebroker.Start(kfakebroker.Options{Listen: addr, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("broker restarted")
	time.Sleep(1 * time.Second)
	kill(c2)
	c2 = start("c2b")
	time.Sleep(2 * time.Second)
	kill(c1)
	c1 = start("c1b")
	time.Sleep(3 * time.Second)
	pcancel()
	<-pdone
	mu.Lock()
	all := append([]string(nil), ids...)
	mu.Unlock()
	t0 := time.Now()
	if !wait.Until(60*time.Second, func() (bool, string) { return len(got.missing(all)) == 0, "" }) {
		miss := got.missing(all)
		// Their goroutine dumps go to stderr, for the diagnosis.
		_ = c1.Process.Signal(syscall.SIGQUIT)
		_ = c2.Process.Signal(syscall.SIGQUIT)
		t.Fatalf("%d of %d messages not delivered within %s, e.g. %v", len(miss), len(all), time.Since(t0), miss[:min(5, len(miss))])
	}
	t.Logf("%d messages; all delivered %s after the load", len(all), time.Since(t0))
}

// outageLogger is the helper's Watermill logger: stderr with
// POSTHORN_OUTAGE_LOG=1 (reconnects and group errors, for diagnosis),
// otherwise silent.
func outageLogger() watermill.LoggerAdapter {
	if os.Getenv("POSTHORN_OUTAGE_LOG") == "1" {
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}
