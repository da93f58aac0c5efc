package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
)

// runDevKafka runs kfake as a broker process until SIGINT or SIGTERM. The
// ready line on stdout is part of the contract: scripts and the fault suite
// wait for it before they connect. With --nodes N it is a cluster of N
// brokers on consecutive ports, and each SIGUSR1 elects new partition
// leaders (the fault suite's leadership moves).
func runDevKafka(ctx context.Context, args []string) error {
	fs := newFlags("dev kafka")
	listen := fs.String("listen", kfakebroker.DefaultListen, "host:port to listen on (port 0 picks a free one)")
	dataDir := fs.String("data-dir", "", "directory that keeps records, topics and offsets across restarts (default: in memory)")
	partitions := fs.Int("partitions", kfakebroker.DefaultPartitions, "partitions of ledger.events and of auto-created topics (a fresh data dir only)")
	nodes := fs.Int("nodes", 1, "brokers in the cluster, on consecutive ports from --listen's")
	p, err := fs.start(ctx, args, needs{})
	if err != nil {
		return err
	}
	log := p.log
	b, err := kfakebroker.Start(kfakebroker.Options{
		Listen:     *listen,
		DataDir:    *dataDir,
		Partitions: *partitions,
		Nodes:      *nodes,
		Log:        log,
	})
	if err != nil {
		return err
	}
	shuffle := make(chan os.Signal, 1)
	signal.Notify(shuffle, syscall.SIGUSR1)
	defer signal.Stop(shuffle)
	fmt.Printf("kafka-protocol broker listening on %s\n", strings.Join(b.Addrs(), ","))
	for stop := false; !stop; {
		select {
		case <-shuffle:
			b.ShuffleLeaders()
			log.Info("partition leaders moved (SIGUSR1)")
		case <-ctx.Done():
			stop = true
		}
	}
	// Close writes the broker's state to the data dir; a second signal
	// (os.Exit in signalContext) skips it, which kfake survives too.
	b.Close()
	log.Info("kafka-protocol broker stopped")
	return nil
}
