package peers_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

const (
	drainAccounts   = 2_000
	drainPerAccount = 100 // drainAccounts × drainPerAccount = 200,000 events
	drainEvents     = drainAccounts * drainPerAccount
	partitions      = 16
	latencyRate     = 250 // postings per second, two events each
	latencyPeriod   = 10 * time.Second
	latencyWriters  = 4
	// debeziumTopic is where the Outbox Event Router routes rows whose
	// aggregatetype is 'account', by its default route.topic.replacement
	// (outbox.event.${routedByValue}).
	debeziumTopic = "outbox.event.account"
)

// peerResult is one relay's figures.
type peerResult struct {
	name      string
	drained   time.Duration // from the relay's start to the last event readable
	startup   time.Duration // from its start to the first event readable
	drainRate float64       // events per second over drained
	p50, p99  time.Duration // commit → readable at latencyRate
	postings  int           // postings committed in the latency period
	cpu       cpuUse        // each part's CPU over the drain
}

// BenchmarkPeersDrainToKafka is make bench-peers (see the package doc): the
// polling relay, the CDC relay and Debezium's PostgreSQL connector with the
// Outbox Event Router in Kafka Connect standalone, one after the other, on
// one throwaway PostgreSQL cluster (wal_level=logical) and one real
// single-node Apache Kafka broker (scripts/kafka-cluster); then the polling
// relay's drain against kfake, to show how far kfake's figures stand from the
// real broker's.
func BenchmarkPeersDrainToKafka(b *testing.B) {
	root := repoRoot(b)
	dbzClasspath := readClasspath(b, filepath.Join(root, "scripts/debezium/.classpath"), "make bench-peers resolves it")
	brokers := startKafka(b, root)
	c := pgtest.LogicalCluster(b, pgcluster.Options{ExtraConf: map[string]string{
		// As production runs: a commit is flushed before it returns, so it
		// reaches a WAL sender at once (pgcluster turns this off for speed).
		"synchronous_commit": "on",
		"max_connections":    "100",
	}})
	createTopics(b, brokers, core.TopicEvents, debeziumTopic)
	warmBroker(b, brokers, 2*drainEvents)

	var results []peerResult
	var kfakeRate float64
	var top ceiling
	for range b.N {
		polling := runPosthorn(b, c, brokers, "posthorn", "polling")
		top = measureCeiling(b, brokers)
		results = []peerResult{
			polling,
			runPosthorn(b, c, brokers, "posthorn cdc", "cdc"),
			runDebezium(b, c, brokers, dbzClasspath, false),
			runDebezium(b, c, brokers, dbzClasspath, true),
		}
		kfakeRate = runKfakeDrain(b, c)
	}

	fmt.Printf("\nrelays side by side: %d events drained to one Apache Kafka 4.4.0 node (KRaft, %d partitions, the JVM as kafka-server-start.sh runs it), one throwaway PostgreSQL 15 cluster, 2 cores:\n", drainEvents, partitions)
	fmt.Printf("  the broker's ceiling: the polling relay's %d records (%d bytes of key, value and headers each) produced again from memory, acks=all, idempotent: franz-go %.0f rec/s, kcat %.0f rec/s (the first record's %d headers on every record)\n",
		top.records, top.bytesPerItem, top.franz, top.kcat, top.kcatHeaders)
	fmt.Printf("  %-14s CPU over franz-go's ceiling run: %s; per record: broker %.1f µs, producer %.1f µs\n",
		"", top.franzCPU, top.franzCPU.perEvent(partBroker, top.records), top.franzCPU.perEvent(partBench, top.records))
	for _, r := range results {
		past := float64(drainEvents) / (r.drained - r.startup).Seconds()
		fmt.Printf("  %-14s drained in %7s (first event readable after %6s): %8.0f ev/s, %.2f of franz-go's ceiling, %.2f of kcat's; past its first event %8.0f ev/s, %.2f, %.2f; commit → readable at %d postings/s (%d committed): p50 %s, p99 %s\n",
			r.name, r.drained.Round(time.Millisecond), r.startup.Round(time.Millisecond), r.drainRate, r.drainRate/top.franz, r.drainRate/top.kcat,
			past, past/top.franz, past/top.kcat,
			latencyRate, r.postings, r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond))
		fmt.Printf("  %-14s CPU over the drain: %s; per event: database %.1f µs, broker %.1f µs, this process %.1f µs\n",
			"", r.cpu, r.cpu.perEvent(partDatabase, drainEvents), r.cpu.perEvent(partBroker, drainEvents), r.cpu.perEvent(partBench, drainEvents))
	}
	pp, pc, dz, dt := results[0], results[1], results[2], results[3]
	fmt.Printf("drain to Kafka: posthorn %.0f ev/s, posthorn cdc %.0f ev/s, debezium %.0f ev/s (%.1fx), tuned %.0f ev/s (%.1fx)\n",
		pp.drainRate, pc.drainRate, dz.drainRate, pp.drainRate/dz.drainRate, dt.drainRate, pp.drainRate/dt.drainRate)
	fmt.Printf("commit → readable p50/p99 at %d postings/s: posthorn %s/%s, posthorn cdc %s/%s, debezium %s/%s, tuned %s/%s\n", latencyRate,
		ms(pp.p50), ms(pp.p99), ms(pc.p50), ms(pc.p99), ms(dz.p50), ms(dz.p99), ms(dt.p50), ms(dt.p99))
	fmt.Printf("drain to kfake: posthorn %.0f ev/s (%.2fx the real broker's %.0f ev/s)\n", kfakeRate, kfakeRate/pp.drainRate, pp.drainRate)
	b.ReportMetric(pp.drainRate, "posthorn-ev/s")
	b.ReportMetric(pc.drainRate, "posthorn-cdc-ev/s")
	b.ReportMetric(dz.drainRate, "debezium-ev/s")
	b.ReportMetric(dt.drainRate, "debezium-tuned-ev/s")
	b.ReportMetric(kfakeRate, "posthorn-kfake-ev/s")
	b.ReportMetric(top.franz, "ceiling-franz-rec/s")
	b.ReportMetric(top.kcat, "ceiling-kcat-rec/s")
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// runPosthorn drains a committed backlog with Posthorn's relay in mode
// (polling or cdc) to the real broker, then measures commit → readable.
func runPosthorn(b *testing.B, c *pgcluster.Cluster, brokers []string, name, mode string) peerResult {
	ctx := context.Background()
	pool, url := pgtest.LedgerIn(b, c, 16)
	relayPool, err := postgres.Connect(ctx, url+"&application_name="+postgres.RelayApplicationName, 8)
	if err != nil {
		b.Fatal(err)
	}
	defer relayPool.Close()
	sink, err := kafka.New(kafka.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sink.Close() }()
	slot := "bench_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	start := func() func() {
		return relaytest.StartMode(b, mode, relayPool, sink, relay.Settings{Owner: "bench", SinkName: "kafka", CDC: relay.CDC{Slot: slot},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}
	if mode == relay.ModeCDC {
		// The slot exists before the backlog is written, as it does for a
		// relay that has run for a while: start once (StartMode returns
		// once it streams), stop. The drain then reads the backlog from the
		// slot.
		start()()
	}
	if err := relaytest.Fill(ctx, pool, "drain", drainAccounts, drainPerAccount); err != nil {
		b.Fatal(err)
	}
	ids := pgtest.Column[string](b, pool, `SELECT event_id::text FROM outbox`)
	rd := newReader(b, brokers, core.TopicEvents, core.HeaderEventID)
	defer rd.close()
	cpu0 := sampleCPU(b)
	began := time.Now()
	// A CDC relay's start returns once it streams, after its outbox
	// catch-up has sent the backlog: the reader's timestamps time the
	// drain all the same.
	stop := start()
	defer stop()
	res := peerResult{name: name}
	res.startup, res.drained = rd.waitAll(b, name, ids, began, 5*time.Minute)
	res.cpu = cpu0.until(sampleCPU(b))
	res.drainRate = float64(drainEvents) / res.drained.Seconds()
	if mode == "cdc" {
		// The backlog came through the outbox; the slot still holds its
		// WAL, which the relay decodes and skips before it reaches new
		// commits. Latency is measured once the slot has caught up.
		waitSlotCaughtUp(b, pool, slot)
	}

	waker := ledgerstore.NewRelayWaker(pool)
	commit := func(i int) ([]string, error) {
		a, bb := fmt.Sprintf("acc-%d", i%1000), fmt.Sprintf("acc-%d", (i+500)%1000)
		ps, err := relaytest.Commit(ctx, pool, a, bb)
		if err != nil {
			return nil, err
		}
		waker.Wake() // as the ledger store does after commit; CDC ignores it
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.EventID
		}
		return out, nil
	}
	res.p50, res.p99, res.postings = measureLatency(b, name, rd, commit)
	return res
}

// debeziumTuned is how published benchmarks tune Debezium for throughput:
// bigger and fuller batches polled more often, a producer that batches a
// megabyte and lingers for it, compressed, on a bigger heap.
const debeziumTuned = `max.batch.size=20000
max.queue.size=100000
poll.interval.ms=100
`

const debeziumTunedProducer = `producer.batch.size=1048576
producer.linger.ms=50
producer.compression.type=lz4
`

// runDebezium drains the same backlog, written as rows of the table the
// Outbox Event Router expects, with Debezium's PostgreSQL connector in
// Kafka Connect standalone, as shipped or tuned, then measures commit →
// readable.
func runDebezium(b *testing.B, c *pgcluster.Cluster, brokers []string, classpath string, tuned bool) peerResult {
	ctx := context.Background()
	pool, _ := pgtest.LedgerIn(b, c, 16)
	db := pool.Config().ConnConfig.Database
	name, slot, heap, connector, producer := "debezium", "dbz_bench", "-Xmx512m", "", ""
	if tuned {
		name, slot, heap, connector, producer = "debezium tuned", "dbz_bench_tuned", "-Xmx2g", debeziumTuned, debeziumTunedProducer
	}
	for _, q := range []string{
		`CREATE TABLE outbox_dbz (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		   aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`,
		`CREATE PUBLICATION dbz_publication FOR TABLE outbox_dbz`,
		`SELECT pg_create_logical_replication_slot('` + slot + `', 'pgoutput')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	// The same events as relaytest.Fill writes: account acc-drain-i,
	// revisions 1..drainPerAccount in order, the same payload.
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox_dbz (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'account', 'acc-drain-' || a, $3,
       format('{"account":"acc-drain-%s","revision":%s,"currency":"EUR","delta":"1"}', a, r)::jsonb
FROM generate_series(0, $1::int - 1) AS a CROSS JOIN generate_series(1, $2::int) AS r
ORDER BY r, a`, drainAccounts, drainPerAccount, core.TypeAccountPosted); err != nil {
		b.Fatal(err)
	}
	ids := pgtest.Column[string](b, pool, `SELECT id::text FROM outbox_dbz`)
	rd := newReader(b, brokers, debeziumTopic, "id")
	defer rd.close()

	dir := b.TempDir()
	writeFile(b, filepath.Join(dir, "worker.properties"), fmt.Sprintf(`bootstrap.servers=%s
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=%s/offsets.dat
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:0
%s`, strings.Join(brokers, ","), dir, producer))
	writeFile(b, filepath.Join(dir, "outbox.properties"), fmt.Sprintf(`name=posthorn-bench-outbox
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=%d
database.user=%s
database.password=
database.dbname=%s
topic.prefix=bench
plugin.name=pgoutput
slot.name=%s
publication.name=dbz_publication
publication.autocreate.mode=disabled
table.include.list=public.outbox_dbz
snapshot.mode=no_data
tombstones.on.delete=false
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
%s`, c.Port(), c.User(), db, slot, connector))
	logFile, err := os.Create(filepath.Join(dir, "connect.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	cpu0 := sampleCPU(b)
	began := time.Now()
	cmd := exec.Command("java", "-Xms128m", heap, "-cp", classpath,
		"org.apache.kafka.connect.cli.ConnectStandalone", filepath.Join(dir, "worker.properties"), filepath.Join(dir, "outbox.properties"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	rd.failIfExited = func() error {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("Kafka Connect exited (%v); its log: %s", err, tailFile(logFile.Name(), 40))
		default:
			return nil
		}
	}
	res := peerResult{name: name}
	res.startup, res.drained = rd.waitAll(b, name, ids, began, 5*time.Minute)
	res.cpu = cpu0.until(sampleCPU(b))
	res.drainRate = float64(drainEvents) / res.drained.Seconds()

	commit := func(i int) ([]string, error) {
		a, bb := fmt.Sprintf("acc-%d", i%1000), fmt.Sprintf("acc-%d", (i+500)%1000)
		out := []string{uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String()}
		_, err := pool.Exec(ctx, `
INSERT INTO outbox_dbz (id, aggregatetype, aggregateid, type, payload) VALUES
  ($1, 'account', $3::text, $5, format('{"account":"%s","currency":"EUR","delta":"-1"}', $3::text)::jsonb),
  ($2, 'account', $4::text, $5, format('{"account":"%s","currency":"EUR","delta":"1"}', $4::text)::jsonb)`,
			out[0], out[1], a, bb, core.TypeAccountPosted)
		return out, err
	}
	res.p50, res.p99, res.postings = measureLatency(b, name, rd, commit)
	return res
}

// runKfakeDrain is runPosthorn's drain (polling relay) against kfake in
// this process instead of the real broker.
func runKfakeDrain(b *testing.B, c *pgcluster.Cluster) float64 {
	ctx := context.Background()
	fake, err := kfakebroker.Start(kfakebroker.Options{Listen: "127.0.0.1:0", Partitions: partitions})
	if err != nil {
		b.Fatal(err)
	}
	defer fake.Close()
	pool, url := pgtest.LedgerIn(b, c, 16)
	relayPool, err := postgres.Connect(ctx, url+"&application_name="+postgres.RelayApplicationName, 8)
	if err != nil {
		b.Fatal(err)
	}
	defer relayPool.Close()
	sink, err := kafka.New(kafka.Config{Brokers: fake.Addrs()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sink.Close() }()
	if err := relaytest.Fill(ctx, pool, "drain", drainAccounts, drainPerAccount); err != nil {
		b.Fatal(err)
	}
	ids := pgtest.Column[string](b, pool, `SELECT event_id::text FROM outbox`)
	rd := newReader(b, fake.Addrs(), core.TopicEvents, core.HeaderEventID)
	defer rd.close()
	began := time.Now()
	r, err := polling.New(relaystore.New(relayPool), sink, relay.Settings{Owner: "bench", SinkName: "kafka",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = r.Stop(ctx) }()
	_, drained := rd.waitAll(b, "posthorn on kfake", ids, began, 5*time.Minute)
	return float64(drainEvents) / drained.Seconds()
}

// measureLatency commits postings at latencyRate for latencyPeriod with
// commit (which returns the committed event IDs), then waits until the
// reader has read every one of them, and returns the p50 and p99 of
// commit → readable and the number of postings committed.
func measureLatency(b *testing.B, name string, rd *reader, commit func(i int) ([]string, error)) (p50, p99 time.Duration, postings int) {
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		failed    int
		firstErr  error
	)
	tokens := make(chan int, latencyRate)
	var wg sync.WaitGroup
	for range latencyWriters {
		wg.Go(func() {
			for i := range tokens {
				ids, err := commit(i)
				now := time.Now()
				mu.Lock()
				if err != nil {
					failed++ // a deadlock victim: the load moves on
					if firstErr == nil {
						firstErr = err
					}
				} else {
					postings++
					for _, id := range ids {
						committed[id] = now
					}
				}
				mu.Unlock()
			}
		})
	}
	tick := time.NewTicker(10 * time.Millisecond)
	end := time.Now().Add(latencyPeriod)
	n := 0
	for now := range tick.C {
		if now.After(end) {
			break
		}
		for range latencyRate / 100 {
			select {
			case tokens <- n:
				n++
			default: // the writers fall behind: the rate asked is not held
			}
		}
	}
	tick.Stop()
	close(tokens)
	wg.Wait()
	if failed > postings/100 {
		b.Fatalf("%s: %d of %d postings failed to commit, the first: %v", name, failed, failed+postings, firstErr)
	}
	ids := make([]string, 0, len(committed))
	for id := range committed {
		ids = append(ids, id)
	}
	rd.waitFor(b, name, ids, time.Minute)
	lat := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		lat = append(lat, max(rd.readAt(id).Sub(committed[id]), 0))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], postings
}

// reader is an independent Kafka consumer of one topic from its end at the
// reader's start: it notes when each event ID was first read and counts
// records read again.
type reader struct {
	cl     *kgo.Client
	header string
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	first   map[string]time.Time
	repeats int
	noID    int

	failIfExited func() error // set when a peer process may die under us
}

func newReader(b *testing.B, brokers []string, topic, header string) *reader {
	ctx := context.Background()
	offsets := map[string]map[int32]kgo.Offset{topic: {}}
	endOffsets(b, brokers, topic).Each(func(o kadm.ListedOffset) {
		offsets[topic][o.Partition] = kgo.NewOffset().At(o.Offset)
	})
	if len(offsets[topic]) != partitions {
		b.Fatalf("topic %s has %d partitions, want %d", topic, len(offsets[topic]), partitions)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(offsets), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &reader{cl: cl, header: header, cancel: cancel, done: make(chan struct{}), first: map[string]time.Time{}}
	go func() {
		defer close(r.done)
		for rctx.Err() == nil {
			fs := cl.PollFetches(rctx)
			now := time.Now()
			r.mu.Lock()
			fs.EachRecord(func(rec *kgo.Record) {
				id := ""
				for _, h := range rec.Headers {
					if h.Key == r.header {
						id = string(h.Value)
					}
				}
				switch _, seen := r.first[id]; {
				case id == "":
					r.noID++
				case seen:
					r.repeats++
				default:
					r.first[id] = now
				}
			})
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *reader) close() {
	r.cancel()
	<-r.done
	r.cl.Close()
}

func (r *reader) readAt(id string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first[id]
}

// waitFor waits until every one of ids has been read, within d.
func (r *reader) waitFor(b *testing.B, name string, ids []string, d time.Duration) {
	pending := slices.Clone(ids)
	wait.ForStatus(b, d, name+": every event readable on the topic", func() (bool, string) {
		r.mu.Lock()
		pending = slices.DeleteFunc(pending, func(id string) bool { _, ok := r.first[id]; return ok })
		noID := r.noID
		r.mu.Unlock()
		if noID > 0 {
			b.Fatalf("%s: %d records on the topic without a %q header", name, noID, r.header)
		}
		if len(pending) == 0 {
			return true, ""
		}
		if r.failIfExited != nil {
			if err := r.failIfExited(); err != nil {
				b.Fatalf("%s: %v", name, err)
			}
		}
		return false, fmt.Sprintf("%d of %d events are not readable (e.g. %s)", len(pending), len(ids), pending[0])
	})
}

// waitAll waits for every one of ids and returns, from began, when the
// first and the last of them became readable.
func (r *reader) waitAll(b *testing.B, name string, ids []string, began time.Time, d time.Duration) (first, last time.Duration) {
	r.waitFor(b, name, ids, d)
	r.mu.Lock()
	defer r.mu.Unlock()
	lo, hi := r.first[ids[0]], r.first[ids[0]]
	for _, id := range ids {
		t := r.first[id]
		if t.Before(lo) {
			lo = t
		}
		if t.After(hi) {
			hi = t
		}
	}
	if r.repeats > 0 {
		fmt.Fprintf(os.Stderr, "%s: %d records read again (same event ID)\n", name, r.repeats)
	}
	fmt.Fprintf(os.Stderr, "%s: %d events readable, first after %s, last after %s\n", name, len(ids), lo.Sub(began).Round(time.Millisecond), hi.Sub(began).Round(time.Millisecond))
	return lo.Sub(began), hi.Sub(began)
}

// startKafka starts one real Apache Kafka node with scripts/kafka-cluster,
// its JVM set as kafka-server-start.sh sets it (the tests' fast-starting
// JVM would understate every side), stopped when the benchmark ends (and
// by the script's own watcher if this process dies first).
func startKafka(b *testing.B, root string) []string {
	dir := b.TempDir()
	script := filepath.Join(root, "scripts/kafka-cluster")
	out, err := exec.Command(script, "start", "--nodes", "1", "--dir", dir, "--jvm", "production",
		"--partitions", fmt.Sprint(partitions), "--owner", fmt.Sprint(os.Getpid())).CombinedOutput()
	if err != nil {
		b.Fatalf("scripts/kafka-cluster start: %v\n%s", err, out)
	}
	b.Cleanup(func() {
		if out, err := exec.Command(script, "stop", "--dir", dir).CombinedOutput(); err != nil {
			b.Logf("scripts/kafka-cluster stop: %v\n%s", err, out)
		}
	})
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "bootstrap="); ok {
			return strings.Split(v, ",")
		}
	}
	b.Fatalf("scripts/kafka-cluster start printed no bootstrap= line:\n%s", out)
	return nil
}

func createTopics(b *testing.B, brokers []string, topics ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	res, err := kadm.NewClient(cl).CreateTopics(context.Background(), partitions, 1, nil, topics...)
	if err != nil {
		b.Fatal(err)
	}
	for _, t := range res.Sorted() {
		if t.Err != nil {
			b.Fatalf("create topic %s: %v", t.Topic, t.Err)
		}
	}
}

// ledgerDB creates a migrated ledger database in c (dropped when the
// benchmark ends, its slots first) and returns a pool on it and its URL.
// waitSlotCaughtUp waits until slot has confirmed the WAL written before
// the call: the relay reading it is past the backlog and streams new
// commits as they come.
func waitSlotCaughtUp(b *testing.B, pool *pgxpool.Pool, slot string) {
	ctx := context.Background()
	var lsn string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	wait.For(b, 2*time.Minute, "slot "+slot+" to confirm "+lsn, func() bool {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $1`, slot, lsn).Scan(&ok)
		return err == nil && ok
	})
}

func repoRoot(b *testing.B) string {
	dir, err := filepath.Abs("../..")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "scripts/kafka-cluster")); err != nil {
		b.Fatalf("repository root not found from the package directory: %v", err)
	}
	return dir
}

func readClasspath(b *testing.B, path, hint string) string {
	cp, err := os.ReadFile(path)
	if err != nil || len(strings.TrimSpace(string(cp))) == 0 {
		b.Fatalf("%s is missing or empty (%s): %v", path, hint, err)
	}
	return strings.TrimSpace(string(cp))
}

func writeFile(b *testing.B, path, content string) {
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		b.Fatal(err)
	}
}

func tailFile(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
