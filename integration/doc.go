// Package integration proves Posthorn's guarantees end to end, across
// packages and over real parts: every committed posting's events reach
// every consumer and take effect exactly once per consumer, in revision
// order per account, with no rolled-back event anywhere and the
// consumers' balances equal to the ledger's — through crashes, broker
// outages and restarts, lease takeovers, terminated sessions, moved
// partition leaders and held transactions. It holds tests and benchmarks
// only; this file is its sole non-test source.
//
// What the tests cover, by file prefix:
//
//   - relay_*: the polling relay to Kafka (kfake over real sockets):
//     keys, headers and order read back by watermill-kafka, kcat and the
//     broker; outages, oversized records, leaders moved and broker
//     processes killed mid-drain, with the old sarama sink as the
//     negative control.
//   - cdc_*: the CDC relay through a broker outage and a crash.
//   - consumer_*: the example consumers behind the inbox, over gochannel
//     and kfake: duplicates, reordering, missing predecessors, poison
//     messages, two instances racing, restarts; each protection with a
//     control that switches it off and shows the effect doubled.
//   - sinks_*: postings → relay → NATS, Redis, RabbitMQ or PostgreSQL →
//     the projection, with the broker taken down mid-run and back.
//   - ops_*: reconcile, resend, replay, archive and cleanup against the
//     real ledger, relay and consumers.
//   - security_*: each component under its own database role, broker
//     credentials and TLS, no secret in any log, the metadata allow-list
//     and size limit, the metrics each running process exposes.
//   - fault_test.go: the fault suite (package faultkit), which runs the
//     posthorn binary as separate processes — the dev Kafka-protocol
//     broker, the API, two relays, two consumers — under HTTP load and
//     SIGKILLs, SIGSTOPs, pg_terminate_backend, broker outages and held
//     transactions at random moments, then checks the invariants with SQL
//     over both databases. Its negative controls run the same faults with
//     the inbox off (--unsafe-no-inbox) and with the marker written before
//     the broker's ACK (--unsafe-mark-before-ack), and must see the check
//     fail.
//
// Running it:
//
//	go test -race -count=1 -timeout 25m ./integration/      # everything, about 8 minutes
//	go test -race -count=1 -v -run '^TestFault' -timeout 30m ./integration/
//	                                                        # the fault suite and its controls (make test-faults)
//	make soak                                               # the long fault suite
//
// POSTHORN_SOAK=1 (what make soak sets) runs the fault suite at length —
// POSTHORN_SOAK_DURATION (default 30m) of load, POSTHORN_SOAK_POSTINGS
// (default 200000) postings, hundreds of kills, the figures written to
// POSTHORN_SOAK_OUT (default soak-YYYYMMDD-HHMM.txt at the repository
// root) — and the relay's broker-kill drains at full size, the sarama
// control POSTHORN_SOAK_CONTROL_RUNS times. -short skips the tests that
// run real processes for minutes.
//
// What it needs on the machine:
//
//   - PostgreSQL at POSTHORN_TEST_DATABASE_URL (default
//     postgres://postgres@127.0.0.1:5432/postgres, trust auth); each test
//     gets fresh databases (internal/testkit/pgtest), so the server's
//     max_connections bounds how many run at once.
//   - The PostgreSQL server binaries (initdb, pg_ctl) for the CDC tests'
//     throwaway wal_level=logical clusters (internal/dev/pgcluster).
//   - nats-server and redis-server binaries (the tests start their own,
//     to kill them), and RabbitMQ: the machine's node on 127.0.0.1:5672
//     with guest/guest, plus rabbitmq-server to start a node of a test's
//     own where it can (else the outage is simulated, and logged as
//     such); the benchmarks use the machine's NATS and Redis too. kcat
//     for the independent Kafka read.
//   - The Go toolchain: the fault suite and the process tests build
//     ./cmd/posthorn once (faultkit.Build, tag posthorn_unsafe).
//
// Kafka itself is never needed: the Kafka-protocol broker is kfake, in
// process or as `posthorn dev kafka`.
//
// TestMain checks with goleak that no test leaves a goroutine of ours
// running.
package integration
