package main

import (
	"context"
	"fmt"
	"os"

	"github.com/posthorn/posthorn/adapters/kfakebroker"
)

func init() {
	register(command{name: "dev kafka", summary: "a standalone Kafka-protocol broker for local work (kfake): --listen, --data-dir", run: runDevKafka})
}

// runDevKafka runs kfake as a broker process until SIGINT or SIGTERM. The
// ready line on stdout is part of the contract: scripts and the fault suite
// wait for it before they connect.
func runDevKafka(ctx context.Context, args []string) error {
	fs, path := flagSet("dev kafka")
	listen := fs.String("listen", kfakebroker.DefaultListen, "host:port to listen on (port 0 picks a free one)")
	dataDir := fs.String("data-dir", "", "directory that keeps records, topics and offsets across restarts (default: in memory)")
	partitions := fs.Int("partitions", kfakebroker.DefaultPartitions, "partitions of ledger.events and of auto-created topics (a fresh data dir only)")
	cfg, err := loadConfig(fs, path, args)
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log, os.Stderr)
	b, err := kfakebroker.Start(kfakebroker.Options{
		Listen:     *listen,
		DataDir:    *dataDir,
		Partitions: *partitions,
		Log:        log,
	})
	if err != nil {
		return err
	}
	fmt.Printf("kafka-protocol broker listening on %s\n", b.Addrs()[0])
	<-ctx.Done()
	// Close writes the broker's state to the data dir; a second signal
	// (os.Exit in signalContext) skips it, which kfake survives too.
	b.Close()
	log.Info("kafka-protocol broker stopped")
	return nil
}
