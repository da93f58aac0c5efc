// Package kfakebroker runs franz-go's kfake as a single-node
// Kafka-protocol broker for local work, the demo and fault tests: a real
// socket speaking the Kafka protocol, without a JVM.
//
// Invariants:
//
//   - One broker (node 0) listens on exactly the address asked for; its
//     metadata advertises that address, so clients must be able to reach it
//     as written (use a concrete host such as 127.0.0.1, not 0.0.0.0). With
//     Options.Nodes > 1, node i listens on the next ports (port+i), or on
//     free ports when the port asked for is 0; every node serves every
//     partition's data, and ShuffleLeaders moves leadership among them.
//   - Topics named in Options.Topics exist with Options.Partitions
//     partitions when a fresh broker starts; any other topic (commands.*)
//     is created on first use with the same partition count.
//   - With a DataDir, kfake writes each produced batch to segment files as
//     it is acknowledged (through the OS page cache; it fsyncs on segment
//     roll and Close), and topics, committed offsets and producer IDs to
//     state files. A broker restarted on the same directory serves the same
//     records at the same offsets, after Close and after the process was
//     killed; a machine crash may lose the unsynced tail. On a restart the
//     persisted topics win: Topics and Partitions apply only to a fresh
//     directory.
//   - One process at a time owns a DataDir: Start takes an exclusive lock
//     on it and fails fast when another broker holds it.
package kfakebroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Defaults for the zero Options.
const (
	DefaultListen     = "127.0.0.1:9092"
	DefaultPartitions = 8
)

// DefaultTopics are seeded on a fresh broker: the event topic. Command
// topics (commands.<service>) are auto-created on first use.
var DefaultTopics = []string{"ledger.events"}

// Options configure Start.
type Options struct {
	// Listen is host:port; port 0 picks a free port (see Addrs). Empty
	// means DefaultListen.
	Listen string
	// DataDir persists the broker's log and state across restarts; empty
	// keeps everything in memory.
	DataDir string
	// Partitions of seeded and auto-created topics; 0 means
	// DefaultPartitions.
	Partitions int
	// Topics to seed; nil means DefaultTopics.
	Topics []string
	// Nodes is the number of brokers in the cluster; 0 means 1.
	Nodes int
	// Log receives kfake's warnings and errors; nil discards them.
	Log *slog.Logger
}

// Broker is a running broker. Close is safe to call more than once and
// from any goroutine.
type Broker struct {
	cluster   *kfake.Cluster
	unlock    func()
	closeOnce sync.Once
}

// Start starts the broker and returns once it accepts connections.
func Start(opts Options) (*Broker, error) {
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	if opts.Partitions == 0 {
		opts.Partitions = DefaultPartitions
	}
	if opts.Partitions < 0 {
		return nil, fmt.Errorf("kfakebroker: partitions must be positive, got %d", opts.Partitions)
	}
	if opts.Topics == nil {
		opts.Topics = DefaultTopics
	}
	host, portStr, err := net.SplitHostPort(opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("kfakebroker: listen address %q: %w", opts.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("kfakebroker: listen address %q: bad port", opts.Listen)
	}

	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	if opts.Nodes < 0 || opts.Nodes > 16 {
		return nil, fmt.Errorf("kfakebroker: nodes must be 1 to 16, got %d", opts.Nodes)
	}
	ports := make([]int, opts.Nodes)
	for i := range ports {
		if port != 0 {
			ports[i] = port + i
		}
	}
	kopts := []kfake.Opt{
		// Ports fixes the brokers on these ports; kfake itself always binds
		// 127.0.0.1, so ListenFn swaps in the host asked for.
		kfake.Ports(ports...),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return net.Listen(network, net.JoinHostPort(host, p))
		}),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(opts.Partitions),
		kfake.SeedTopics(int32(opts.Partitions), opts.Topics...),
	}
	if opts.Log != nil {
		kopts = append(kopts, kfake.WithLogger(slogLogger{opts.Log}))
	}

	unlock := func() {}
	if opts.DataDir != "" {
		if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("kfakebroker: data dir: %w", err)
		}
		unlock, err = lockDir(filepath.Join(opts.DataDir, ".posthorn-broker.lock"))
		if err != nil {
			return nil, fmt.Errorf("kfakebroker: data dir %s: %w", opts.DataDir, err)
		}
		kopts = append(kopts, kfake.DataDir(opts.DataDir))
	}
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("kfakebroker: start on %s: %w", opts.Listen, err)
	}
	return &Broker{cluster: c, unlock: unlock}, nil
}

// Addrs returns the addresses the brokers listen on, node 0 first, with the
// ports resolved when Options.Listen asked for port 0.
func (b *Broker) Addrs() []string { return b.cluster.ListenAddrs() }

// ShuffleLeaders gives every partition a randomly chosen leader among the
// nodes and bumps the leader epochs, as a leader election would: clients
// writing to a former leader get NOT_LEADER_OR_FOLLOWER and must find the
// new one.
func (b *Broker) ShuffleLeaders() { b.cluster.ShufflePartitionLeaders() }

// Close stops accepting connections, writes the broker's state to the data
// directory (when there is one) and releases it.
func (b *Broker) Close() {
	b.closeOnce.Do(func() {
		b.cluster.Close()
		b.unlock()
	})
}

// ErrDataDirInUse is returned by Start when another broker holds DataDir.
var ErrDataDirInUse = errors.New("in use by another broker")

type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	var lv slog.Level
	switch level {
	case kfake.LogLevelError:
		lv = slog.LevelError
	case kfake.LogLevelWarn:
		lv = slog.LevelWarn
	default:
		// kfake logs every request at info: that is debug detail for us.
		lv = slog.LevelDebug
	}
	ctx := context.Background()
	if s.l.Enabled(ctx, lv) {
		s.l.Log(ctx, lv, fmt.Sprintf(format, args...), "component", "kfake")
	}
}
