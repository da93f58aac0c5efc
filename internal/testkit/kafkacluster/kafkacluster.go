// Package kafkacluster gives tests a real Apache Kafka cluster (KRaft,
// every node broker and controller) through scripts/kafka-cluster, the
// same script developers and CI scripts run, so what the tests prove holds
// for the cluster the script describes: on 3 nodes replication factor 3,
// min.insync.replicas=2, unclean leader election off, the transaction
// state log replicated 3 with min ISR 2.
//
// When POSTHORN_TEST_KAFKA_BROKERS is set (comma-separated bootstrap
// servers), Start returns that external cluster instead of starting one;
// it is not this package's to kill, so Kill and Restart skip the test that
// asks, saying why (RequireOwn lets a test skip before it begins).
//
// A cluster is stopped at the test's cleanup (Start) or by Stop (New, for
// a TestMain that shares one cluster across a package's tests). Its nodes
// are also stopped when the test process exits without stopping them (the
// script's --owner watcher), so a test binary that dies or times out
// leaves no JVM behind on a machine others share.
package kafkacluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EnvBrokers names the environment variable of an external cluster's
// bootstrap servers.
const EnvBrokers = "POSTHORN_TEST_KAFKA_BROKERS"

// Version is the Apache Kafka version the script runs (scripts/kafka/pom.xml),
// for test names and output that say which broker they ran against.
const Version = "4.4.0"

// Node is one node of a cluster the script started: Port is its client
// (and inter-broker) listener, ControllerPort its KRaft controller's.
type Node struct {
	ID, PID, Port, ControllerPort int
}

// Cluster is a running cluster.
type Cluster struct {
	// Brokers are the bootstrap servers.
	Brokers []string
	// Nodes are the script's nodes; nil for an external cluster.
	Nodes []Node
	// Dir holds the nodes' configuration, data and logs (server.log).
	Dir string

	script string
	mu     sync.Mutex // guards Nodes across restarts
}

// External reports whether the cluster is POSTHORN_TEST_KAFKA_BROKERS's.
func (c *Cluster) External() bool { return c.script == "" }

// Name says which broker a test ran against, for its output.
func (c *Cluster) Name() string {
	if c.External() {
		return "external Kafka cluster " + strings.Join(c.Brokers, ",")
	}
	nodes := "nodes"
	if len(c.Nodes) == 1 {
		nodes = "node"
	}
	return fmt.Sprintf("Apache Kafka %s, %d KRaft %s", Version, len(c.Nodes), nodes)
}

// Options configure New.
type Options struct {
	// Nodes is 1 or 3.
	Nodes int
	// Dir receives the cluster's files; it must exist.
	Dir string
	// Partitions is the default of auto-created topics (0: the script's, 4).
	Partitions int
	// Users, when set, names one Unix user per node, which that node runs
	// as (with root's file access): a test can then cut one node's links
	// by its user.
	Users []string
}

// New starts a cluster with the script (or returns the external one) and
// returns once it stores a record produced with acks=all. The caller must
// Stop it.
func New(ctx context.Context, o Options) (*Cluster, error) {
	if v := os.Getenv(EnvBrokers); v != "" {
		return &Cluster{Brokers: strings.Split(v, ",")}, nil
	}
	script, err := Script()
	if err != nil {
		return nil, err
	}
	args := []string{"start", "--nodes", strconv.Itoa(o.Nodes), "--dir", o.Dir, "--owner", strconv.Itoa(os.Getpid())}
	if o.Partitions > 0 {
		args = append(args, "--partitions", strconv.Itoa(o.Partitions))
	}
	if len(o.Users) > 0 {
		args = append(args, "--users", strings.Join(o.Users, ","))
	}
	out, err := run(ctx, script, args...)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: o.Dir, script: script}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if b, ok := strings.CutPrefix(line, "bootstrap="); ok {
			c.Brokers = strings.Split(b, ",")
			continue
		}
		n, err := parseNode(line)
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	if len(c.Brokers) == 0 || len(c.Nodes) != o.Nodes {
		_ = c.Stop()
		return nil, fmt.Errorf("kafka-cluster start printed %q: want a bootstrap line and %d node lines", out, o.Nodes)
	}
	return c, nil
}

// Start is New for one test: a cluster of nodes in a directory of the
// test's, stopped at its cleanup. It skips in -short mode (it starts JVMs).
func Start(t testing.TB, nodes int) *Cluster {
	t.Helper()
	return StartWith(t, Options{Nodes: nodes})
}

// StartWith is Start with options; o.Dir is the test's own when empty.
func StartWith(t testing.TB, o Options) *Cluster {
	t.Helper()
	if testing.Short() && os.Getenv(EnvBrokers) == "" {
		t.Skip("starts an Apache Kafka cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	began := time.Now()
	if o.Dir == "" {
		o.Dir = t.TempDir()
		if len(o.Users) > 0 {
			// Java checks its data files with access(2), which needs the
			// nodes' users to be able to enter every directory above
			// (their capabilities do not count there): the test's own
			// directories, up to the temporary directory's root.
			for d := o.Dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
				if err := os.Chmod(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	c, err := New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("%s at %s, up in %v", c.Name(), strings.Join(c.Brokers, ","), time.Since(began).Round(100*time.Millisecond))
	return c
}

// RequireOwn skips t when the cluster is external: the test kills or
// restarts nodes.
func (c *Cluster) RequireOwn(t testing.TB) {
	t.Helper()
	if c.External() {
		t.Skipf("%s points at an external cluster; this test kills and restarts broker nodes, which only a cluster it started may do", EnvBrokers)
	}
}

// Kill SIGKILLs node i and returns once its process is gone.
func (c *Cluster) Kill(t testing.TB, i int) {
	t.Helper()
	c.RequireOwn(t)
	if err := c.KillNode(i); err != nil {
		t.Fatal(err)
	}
}

// Restart starts node i again on its own data directory and port (killing
// it first if it runs) and returns once it listens.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	c.RequireOwn(t)
	if err := c.RestartNode(i); err != nil {
		t.Fatal(err)
	}
}

// KillNode is Kill for callers without a testing.TB (a fault injector).
func (c *Cluster) KillNode(i int) error {
	if c.External() {
		return errors.New("kafkacluster: an external cluster's nodes are not ours to kill")
	}
	_, err := run(context.Background(), c.script, "kill", strconv.Itoa(i), "--dir", c.Dir)
	return err
}

// RestartNode is Restart for callers without a testing.TB.
func (c *Cluster) RestartNode(i int) error {
	if c.External() {
		return errors.New("kafkacluster: an external cluster's nodes are not ours to restart")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := run(ctx, c.script, "restart", strconv.Itoa(i), "--dir", c.Dir)
	if err != nil {
		return err
	}
	n, err := parseNode(strings.TrimSpace(string(out)))
	if err != nil {
		return err
	}
	c.mu.Lock()
	if i < len(c.Nodes) {
		c.Nodes[i] = n
	}
	c.mu.Unlock()
	return nil
}

// RestartNodes restarts the nodes ids side by side (as after a power cut
// of the whole cluster) and returns once each listens.
func (c *Cluster) RestartNodes(ids ...int) error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for j, i := range ids {
		wg.Go(func() { errs[j] = c.RestartNode(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// All is the IDs of the script's nodes, 0 to len(Nodes)-1.
func (c *Cluster) All() []int {
	ids := make([]int, len(c.Nodes))
	for i := range ids {
		ids[i] = i
	}
	return ids
}

// Stop stops every node; no JVM of the cluster is left. An external
// cluster is left alone.
func (c *Cluster) Stop() error {
	if c.External() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := run(ctx, c.script, "stop", "--dir", c.Dir); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.Nodes {
		// Signal 0 checks for the process: a JVM left behind is an error.
		if err := syscall.Kill(n.PID, 0); err == nil {
			return fmt.Errorf("kafkacluster: node %d (pid %d) still runs after stop", n.ID, n.PID)
		}
	}
	return nil
}

// Script is the path of scripts/kafka-cluster in the module that holds
// the working directory.
func Script() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "scripts", "kafka-cluster"), nil
}

// Root is the directory of the module that holds the working directory.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kafkacluster: no go.mod above the working directory, so no scripts/kafka-cluster")
		}
		dir = parent
	}
}

func run(ctx context.Context, script string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kafka-cluster %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// parseNode reads a "node=I pid=P port=Q cport=C" line.
func parseNode(line string) (Node, error) {
	var n Node
	if _, err := fmt.Sscanf(line, "node=%d pid=%d port=%d cport=%d", &n.ID, &n.PID, &n.Port, &n.ControllerPort); err != nil {
		return n, fmt.Errorf("kafka-cluster printed %q, want node=I pid=P port=Q cport=C: %v", line, err)
	}
	return n, nil
}
