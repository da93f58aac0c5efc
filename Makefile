# Posthorn's build, test and benchmark entry points. The README's commands
# and .ci/run call these targets.
GO      ?= go
PKGS    ?= ./...
BIN     := bin/posthorn
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

# setup: make this machine ready for the tests (packages, services, the
# Kafka broker's class path); idempotent, needs root. make test runs it first.
.PHONY: setup build test test-race test-faults test-partitions test-short lint bench bench-peers bench-consumers bench-horizon bench-history soak soak-kafka-control soak-horizon soak-history demo clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/posthorn

setup:
	bash scripts/setup-machine

# The README's test command: the machine's set-up (idempotent), vet, then
# every test with the race detector,
# the short fault suite (real processes, 20,000 postings, SIGKILLs, broker
# outage) and its two negative controls included.
test: setup
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 25m $(PKGS)
	# RabbitMQ's real node restart, which watermill-amqp's known reconnect
	# race (watermill issue 693) keeps out of the -race run.
	$(GO) test -count=1 -timeout 5m -run 'TestSinksEndToEndBrokerRestart/amqp' ./integration/
	# Watermill's universal pub/sub tests on every sink, which watermill-nats'
	# own data race (and the detector's slowness) keeps out of the -race run.
	$(GO) test -count=1 -timeout 10m -run '^TestUniversalPubSub' ./adapters/brokers/

test-race: test

# Only the fault suite and its controls (part of make test too), verbose,
# so its figures are printed.
test-faults:
	$(GO) test -race -count=1 -v -run '^TestFault' -timeout 30m ./integration/

# The partition suite whole (make test runs a subset of it): nine network
# faults on a real three-node Kafka cluster, each in polling, CDC and
# exactly-once mode, and each scenario's negative control; verbose, the
# figures in partitions.log. About an hour on a 2-core machine. Ends with
# the one line "partitions: N scenarios, M runs, lost …".
test-partitions: setup
	@{ POSTHORN_PARTITIONS=all $(GO) test -count=1 -v -run '^TestPartition(s|Controls)$$' -timeout 3h ./integration/; \
		echo $$? >.partitions.status; } 2>&1 | tee partitions.log
	@status=$$(cat .partitions.status); rm -f .partitions.status; \
		sed -n 's/^PARTITIONS-SUMMARY //p' partitions.log | tail -1; exit $$status

test-short:
	$(GO) test -short -count=1 $(PKGS)

# lint also checks that every relative link and #anchor of README.md and
# docs/*.md resolves (internal/doclinks).
lint:
	test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.6.1 $(PKGS)
	$(GO) test -count=1 ./internal/doclinks/

# Benchmarks: side-by-side figures the issues ask for. Stays under 10 minutes.
# Only the packages that hold benchmarks: building every package's test
# binary for nothing took about four of those minutes.
# integration/peers is bench-peers' alone: it starts Kafka and a JVM;
# integration/horizon is bench-horizon's, whose run alone takes minutes.
BENCH_PKGS ?= $(shell grep -rl --include='*_test.go' '^func Benchmark' . | xargs -n1 dirname | sort -u | grep -v -E '^./integration/(peers|horizon)$$')
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 10m $(BENCH_PKGS)

# Posthorn's polling and CDC relays side by side with Debezium (Kafka Connect
# standalone, the Outbox Event Router) on the same 200,000 events, the same
# PostgreSQL and one real Apache Kafka node, and the polling relay against
# kfake: docs/measured.md. Resolves Connect and Debezium with Maven first
# (scripts/debezium/pom.xml, cached in ~/.m2). Under 10 minutes.
bench-peers: setup
	@out=$$(mvn -q -B -Dstyle.color=never -f scripts/debezium/pom.xml dependency:build-classpath -Dmdep.outputFile=.classpath 2>&1) || \
		{ echo "$$out"; echo "Maven could not resolve scripts/debezium/pom.xml"; exit 1; }
	$(GO) test -run '^$$' -bench '^BenchmarkPeersDrainToKafka$$' -benchtime 1x -count 1 -timeout 10m ./integration/peers/

# The example consumers as `posthorn consume` processes applying 200,000
# events from one real Apache Kafka node, from process start (both in one
# process, each in its own, each alone): docs/measured.md.
bench-consumers: setup
	$(GO) test -run '^$$' -bench '^BenchmarkPeersConsumers$$' -benchtime 1x -count 1 -timeout 10m ./integration/peers/

# The relay and the write path while a REPEATABLE READ snapshot pins the
# ledger's MVCC horizon, every part a process (integration/horizon): the old
# design (posthorn built from a git worktree of commit 3171dac) and this
# tree one after the other, 1,000 events/s through posthorn_publish and 100
# postings/s through the API, figures per 30 s window side by side
# (docs/measured.md). The short version: a 90 s snapshot with 30 s of calm
# before and after, polling only, about 6 minutes with the builds; make
# soak runs the long one (soak-horizon).
bench-horizon:
	POSTHORN_HORIZON_SNAPSHOT=90s POSTHORN_HORIZON_CALM=30s POSTHORN_HORIZON_MODES=polling \
		$(GO) test -run '^$$' -bench BenchmarkLongSnapshot -benchtime 1x -count 1 -timeout 10m ./integration/horizon/

# The long snapshot at length: HORIZON_SNAPSHOT (or the environment's
# POSTHORN_HORIZON_SNAPSHOT; default 10m) at HORIZON_RATE events/s
# (POSTHORN_HORIZON_RATE; default 1000), 60 s of calm before and after,
# polling then CDC, old design then this tree: about 50 minutes.
HORIZON_SNAPSHOT ?= $(or $(POSTHORN_HORIZON_SNAPSHOT),10m)
HORIZON_RATE ?= $(or $(POSTHORN_HORIZON_RATE),1000)
soak-horizon:
	POSTHORN_HORIZON_SNAPSHOT=$(HORIZON_SNAPSHOT) POSTHORN_HORIZON_RATE=$(HORIZON_RATE) \
		$(GO) test -run '^$$' -bench BenchmarkLongSnapshot -benchtime 1x -count 1 -timeout 3h ./integration/horizon/

# Cost as the history grows (integration/history): the write path, the
# relay's drain and commit-to-ACK p99, consumer apply, the failover check,
# reconcile, archive and cleanup on an empty database and on one loaded
# set-based with 1,000,000 events of history, each as a ratio
# (docs/measured.md). Under 10 minutes, the load included.
bench-history:
	POSTHORN_BENCH_1M=1 POSTHORN_HISTORY_EVENTS=1000000 \
		$(GO) test -run '^$$' -bench '^BenchmarkHistory$$' -benchtime 1x -count 1 -timeout 30m ./integration/history/

# bench-history on 10,000,000 events of history (HISTORY_EVENTS, or the
# environment's POSTHORN_HISTORY_EVENTS): about an hour on this machine,
# 14 minutes of it loading the history and 29 the two whole failover checks.
HISTORY_EVENTS ?= $(or $(POSTHORN_HISTORY_EVENTS),10000000)
soak-history:
	POSTHORN_BENCH_1M=1 POSTHORN_HISTORY_EVENTS=$(HISTORY_EVENTS) \
		$(GO) test -run '^$$' -bench '^BenchmarkHistory$$' -benchtime 1x -count 1 -timeout 4h ./integration/history/

# The demo on embedded defaults: a throwaway PostgreSQL (needs the server
# binaries, e.g. apt-get install postgresql), an in-process Kafka-protocol
# broker, the API, the relay and the example consumers in one process.
# Pass flags with DEMO_FLAGS, e.g. make demo DEMO_FLAGS='--postings 10000 --json'.
demo: build
	$(BIN) demo $(DEMO_FLAGS)

# The long fault suite: SOAK_DURATION of load (default 30m), SOAK_POSTINGS
# postings, hundreds of SIGKILLs; figures go to soak-YYYYMMDD-HHMM.txt. Then
# the Kafka broker-kill drain at 400,000 events and its sarama control, and
# the whole partition suite (test-partitions) and the long snapshot
# (soak-horizon).
SOAK_DURATION ?= 30m
SOAK_POSTINGS ?= 200000
soak:
	POSTHORN_SOAK=1 POSTHORN_SOAK_DURATION=$(SOAK_DURATION) POSTHORN_SOAK_POSTINGS=$(SOAK_POSTINGS) \
		$(GO) test -count=1 -v -run '^(TestFaultSuite|TestRelayDrainThroughBrokerKills|TestRelayDrainThroughBrokerKillsSaramaControl)$$' -timeout 3h ./integration/
	$(MAKE) soak-kafka-control
	$(MAKE) test-partitions
	$(MAKE) soak-horizon

# The negative control of the Kafka broker-kill case at length:
# the old sarama idempotent sink, KAFKA_CONTROL_RUNS runs of
# KAFKA_CONTROL_DURATION each with 12 or more SIGKILLs of a kfake process,
# 1,000-record batches (a run takes 3-4 minutes here with its restarts and
# read-back of a million records or more). It loses ACKed records in some
# runs only; the test prints each run's count and fails if no run lost.
# The kgo sink then goes through the same runs and must lose nothing.
KAFKA_CONTROL_RUNS ?= 6
KAFKA_CONTROL_DURATION ?= 75s
soak-kafka-control:
	POSTHORN_SOAK=1 POSTHORN_KAFKA_CONTROL_RUNS=$(KAFKA_CONTROL_RUNS) POSTHORN_KAFKA_CONTROL_DURATION=$(KAFKA_CONTROL_DURATION) \
		$(GO) test -count=1 -v -run '^TestBrokerKills(SaramaControl|Long)$$' -timeout 3h ./adapters/kafka/

clean:
	rm -rf bin
