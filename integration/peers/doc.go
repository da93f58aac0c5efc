// Package peers holds make bench-peers: Posthorn's relays side by side with
// Debezium, the relay most teams would otherwise run, draining the same
// outbox backlog from the same PostgreSQL to the same real Apache Kafka
// broker in one run. It has no code of its own; the benchmark is in its
// test files, and it is kept out of make bench because it starts a Kafka
// broker and a Kafka Connect JVM.
//
// What is compared, and why it is fair:
//   - each relay drains 200,000 events that were committed before it
//     started, timed from its start (a JVM's start-up included for
//     Debezium, a slot's catch-up included for the CDC relay) to the last
//     of them readable on the topic by an independent reader;
//   - Debezium streams and does not snapshot: its replication slot and
//     publication exist before the rows are written (snapshot.mode
//     no_data), as they would for a connector that has run for a while;
//     it runs twice, as shipped and tuned the way published benchmarks
//     tune it (max.batch.size 20000, max.queue.size 100000,
//     poll.interval.ms 100, a producer batch of 1 MB with linger.ms 50 and
//     lz4, a 2 GB heap);
//   - then each runs under the same fixed posting rate, and the commit →
//     readable latency is read off the same reader's clock;
//   - every event is counted by its ID, never by position: a relay that
//     lost or repeated one would be named, not averaged away;
//   - beside them, the broker's own ceiling on the same node in the same
//     run: the records the polling relay stored (keys, values, headers)
//     read back and produced again from memory to fresh topics by a plain
//     producer, acks=all and idempotent, with franz-go and with kcat; each
//     relay is printed as a fraction of both, over its whole drain and
//     past its first event (start-up apart);
//   - under each drain and the ceiling's franz-go run, the CPU each part
//     of the machine used, read from /proc: this process (the relay or
//     the ceiling's producer, and the reader), PostgreSQL's processes,
//     the broker's JVM, Kafka Connect's, in seconds, in cores and per
//     event, so a reader sees which part bounds a figure;
//   - the node's JVM runs as kafka-server-start.sh runs it (1 GiB heap,
//     G1, the full JIT), not with the tests' fast-starting settings, and
//     takes 400,000 records of a warm-up before anything is timed (its JIT
//     would otherwise slow whichever side ran first).
//
// BenchmarkPeersConsumers takes the path's last stage on the same broker:
// the example consumers as `posthorn consume` processes applying 200,000
// events already on the topic, each timed from the start of its process
// (the group join and the first fetch are part of the figure, and printed
// apart), with the inbox, as the consumers' own database roles; every run
// checks that each event was applied exactly once and every balance is
// right. POSTHORN_BENCH_BASELINE_BIN runs an older binary beside it.
package peers
