package peers_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// consumerRun is one way `posthorn consume` runs over the backlog: the
// consumers of each process (one process per entry, started together).
type consumerRun struct {
	name      string
	processes [][]string
}

// consumerFigure is one consumer's figures in one run, each time from the
// start of its process.
type consumerFigure struct {
	consumer string
	// joined: its group's first session began (partitions assigned);
	// fetched: its first record was delivered (both zero when the binary
	// does not log them); first and last: its first event and the last of
	// the backlog applied (committed).
	joined, fetched, first, last time.Duration
	rate                         float64 // drainEvents over last
	// cpu is the CPU its process used (shared with a consumer beside it),
	// pg that of the run's consumer database backends (shared by every
	// consumer of the run), both from the start to the last event applied.
	cpu, pg float64
}

// BenchmarkPeersConsumers is the consumers' part of make bench-peers: the
// example consumers as `posthorn consume` processes reading a backlog of
// drainEvents events already on the topic of the real Apache Kafka node,
// each timed from the start of its process (the group join and the first
// fetch included) to its last event applied with the inbox, as a login in
// the consumers' own roles (row-level security on), on the machine's
// PostgreSQL (synchronous_commit on). Runs, each on a consumer database and
// consumer groups of its own: both consumers in one process, each in a
// process of its own started together, and each alone. Every run is
// checked: every event applied exactly once per consumer, nothing held or
// parked, every balance at its account's last revision.
//
// With POSTHORN_BENCH_BASELINE_BIN set to another posthorn binary (the
// code before a change, built with -tags posthorn_unsafe), every run is
// also made with it, interleaved, and printed beside.
func BenchmarkPeersConsumers(b *testing.B) {
	ctx := context.Background()
	root := repoRoot(b)
	brokers := startKafka(b, root)
	createTopics(b, brokers, core.TopicEvents)
	relayToTopic(b, brokers)
	bin, err := faultkit.Build(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	bins := []struct{ name, path string }{{"this tree", bin}}
	if base := os.Getenv("POSTHORN_BENCH_BASELINE_BIN"); base != "" {
		bins = append([]struct{ name, path string }{{"baseline", base}}, bins...)
	}
	both := []string{projection.Name, auditlog.Name}
	runs := []consumerRun{
		{"both consumers in one process", [][]string{both}},
		{"each in its own process, together", [][]string{{projection.Name}, {auditlog.Name}}},
		{"balance-projection alone", [][]string{{projection.Name}}},
		{"audit-log alone", [][]string{{auditlog.Name}}},
	}
	figures := make([][][]consumerFigure, len(runs)) // run → binary → consumers
	for range b.N {
		for i, r := range runs {
			figures[i] = figures[i][:0]
			for _, bb := range bins {
				figures[i] = append(figures[i], runConsumers(b, bb.path, brokers, r))
			}
		}
	}
	fmt.Printf("\nconsumers from process start: `posthorn consume` over %d events on one Apache Kafka 4.4.0 node (%d partitions), with the inbox, as the consumers' own roles:\n", drainEvents, partitions)
	for i, r := range runs {
		for j, bb := range bins {
			for _, f := range figures[i][j] {
				startup := fmt.Sprintf("joined %5.2fs, first record %5.2fs", f.joined.Seconds(), f.fetched.Seconds())
				if f.joined == 0 {
					startup = "(no join or first-record lines in its log)  "
				}
				fmt.Printf("  %-34s %-10s %-18s %7.0f events/s (all applied after %6.2fs; %s, first applied %5.2fs; CPU: process %5.1fs, consumer database %5.1fs)\n",
					r.name, bb.name, f.consumer, f.rate, f.last.Seconds(), startup, f.first.Seconds(), f.cpu, f.pg)
				if bb.name == "this tree" {
					b.ReportMetric(f.rate, strings.ReplaceAll(fmt.Sprintf("%s/%s-ev/s", r.name, f.consumer), " ", "-"))
				}
			}
		}
	}
}

// relayToTopic puts the backlog on the topic as `posthorn relay` writes it:
// relaytest.Fill's events, relayed by the polling relay with the Kafka
// sink.
func relayToTopic(b *testing.B, brokers []string) {
	ctx := context.Background()
	_, pool := pgtest.Ledger(b)
	// relaytest.Fill's backlog with the event IDs the ledger gives
	// (posthorn.uuidv7, time-ordered like the API's), not random ones: the
	// consumers' inbox keys on them, and random keys would cost its
	// indexes what production's do not.
	accounts := make([]string, drainAccounts)
	shards := make([]int32, drainAccounts)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("acc-consume-%d", i)
		shards[i] = int32(core.ShardOf(accounts[i]))
	}
	if _, err := pool.Exec(ctx, `
WITH acc AS (
    INSERT INTO accounts (id, revision) SELECT a, $3 FROM unnest($1::text[]) AS a RETURNING id
)
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
SELECT posthorn.uuidv7(), 'event', $4, $5, $6, a.id, r, a.shard,
       convert_to(format('{"account":"%s","revision":%s,"currency":"EUR","delta":"1"}', a.id, r), 'UTF8'), now()
FROM unnest($1::text[], $2::int[]) AS a(id, shard)
CROSS JOIN generate_series(1, $3::int) AS r
ORDER BY r, a.id`, accounts, shards, drainPerAccount, core.TypeAccountPosted, core.TopicEvents, core.AggregateAccount); err != nil {
		b.Fatal(err)
	}
	sink, err := kafka.New(kafka.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sink.Close() }()
	stop := relaytest.StartMode(b, relay.ModePolling, pool, sink, relay.Settings{Owner: "bench", SinkName: "kafka",
		Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), StatsInterval: time.Minute})
	defer stop()
	wait.For(b, 5*time.Minute, "the relay to put the backlog on the topic", func() bool { return relaytest.Unrelayed(b, pool) == 0 })
}

// runConsumers runs r's processes of bin on a fresh consumer database until
// each consumer applied the backlog, checks what they wrote, stops them,
// and deletes their consumer groups for the next run.
func runConsumers(b *testing.B, bin string, brokers []string, r consumerRun) []consumerFigure {
	ctx := context.Background()
	url, owner := roletest.Consumer(b)
	var all []string
	for _, names := range r.processes {
		all = append(all, names...)
	}
	login := roletest.Consumers(b, url, "", all...)
	var db string
	if err := owner.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		b.Fatal(err)
	}
	backends := func() map[int]float64 {
		return pgtest.BackendCPU(b, owner, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	}
	dir := b.TempDir()
	type running struct {
		proc    *faultkit.Proc
		names   []string
		metrics string
		started time.Time
	}
	procs := make([]running, len(r.processes))
	for i, names := range r.processes {
		metrics := freeAddr(b)
		args := []string{"consume"}
		if len(names) == 1 {
			args = append(args, "--only", names[0])
		}
		procs[i] = running{names: names, metrics: metrics, proc: faultkit.NewProc(faultkit.ProcConfig{
			Name: fmt.Sprintf("consume-%d", i), Bin: bin, LogDir: dir, Args: args,
			Env: []string{"POSTHORN_CONSUMER__DATABASE__URL=" + login, "POSTHORN_SINK__KIND=kafka",
				"POSTHORN_SINK__KAFKA__BROKERS=" + strings.Join(brokers, ","), "POSTHORN_METRICS__LISTEN=" + metrics,
				"POSTHORN_LOG__FORMAT=json", "POSTHORN_LOG__LEVEL=info"},
		})}
	}
	pg0 := backends() // none yet: every backend counts from zero
	for i := range procs {
		procs[i].started = time.Now()
		if err := procs[i].proc.Start(ctx); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for _, p := range procs {
			p.proc.Close()
		}
	}()
	var out []consumerFigure
	for _, p := range procs {
		for _, n := range p.names {
			out = append(out, consumerFigure{consumer: n})
		}
	}
	// Each consumer's applied count, read off its process's /metrics
	// every 20 ms: the inbox is asked only at the end (a count over the
	// whole inbox during the run would take CPU from the consumers it
	// measures).
	deadline := time.Now().Add(10 * time.Minute)
	for {
		done, k := true, 0
		for _, p := range procs {
			body := scrape("http://" + p.metrics + "/metrics") // "" until the process listens
			now := time.Since(p.started)
			for _, n := range p.names {
				f := &out[k]
				k++
				applied := appliedOn(body, n)
				if applied > 0 && f.first == 0 {
					f.first = now
				}
				if applied >= drainEvents && f.last == 0 {
					f.last = now
					f.cpu, _ = pgtest.ProcessCPU(p.proc.Pid())
					f.pg = pgtest.CPUSince(pg0, backends())
				}
				done = done && f.last > 0
			}
			if !p.proc.Running() {
				b.Fatalf("%s: %s exited; log:\n%s", r.name, p.proc.Name, faultkit.Tail(p.proc.LogPath(), 30))
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: the consumers did not apply %d events within 10 minutes: %+v", r.name, drainEvents, out)
		}
		time.Sleep(20 * time.Millisecond) // polling the processes' metrics with a deadline
	}
	k := 0
	for _, p := range procs {
		for _, n := range p.names {
			f := &out[k]
			k++
			f.rate = drainEvents / f.last.Seconds()
			f.joined, f.fetched = startupTimes(b, p.proc.LogPath(), n, p.started)
			checkApplied(b, owner, n)
		}
	}
	for _, p := range procs {
		p.proc.Term(30 * time.Second)
	}
	deleteGroups(b, brokers, all...)
	return out
}

// scrape is the body of a GET of url, or "" when it cannot be read.
func scrape(url string) string {
	res, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		return ""
	}
	return string(body)
}

// appliedOn reads posthorn_consumer_messages_total{consumer,disposition="applied"}
// off a /metrics page.
func appliedOn(body, consumer string) float64 {
	want := fmt.Sprintf(`posthorn_consumer_messages_total{consumer=%q,disposition="applied"} `, consumer)
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, want); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// startupTimes reads, from a consume process's JSON log, when consumer's
// group session began and when its first record was delivered, from the
// process's start (zero when the log does not say).
func startupTimes(b *testing.B, path, consumer string, started time.Time) (joined, fetched time.Duration) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Time  time.Time `json:"time"`
			Msg   string    `json:"msg"`
			Group string    `json:"consumer_group"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Group != consumer {
			continue
		}
		switch {
		case l.Msg == kafkagroup.SessionLogMessage && joined == 0:
			joined = l.Time.Sub(started)
		case l.Msg == kafkagroup.FirstRecordLogMessage && fetched == 0:
			fetched = l.Time.Sub(started)
		}
	}
	return joined, fetched
}

// checkApplied holds consumer's inbox and effect against the backlog: every
// event applied once, nothing else recorded, and (balance-projection) every
// account's balance at its last revision.
func checkApplied(b *testing.B, owner *pgxpool.Pool, consumer string) {
	ctx := context.Background()
	var applied, other, repeats int
	if err := owner.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE disposition = 'applied'), count(*) FILTER (WHERE disposition <> 'applied'), coalesce(sum(duplicates), 0)
		FROM consumer_inbox WHERE consumer = $1`, consumer).Scan(&applied, &other, &repeats); err != nil {
		b.Fatal(err)
	}
	if applied != drainEvents || other != 0 {
		b.Fatalf("%s: %d events applied and %d recorded otherwise, want %d applied and nothing else", consumer, applied, other, drainEvents)
	}
	var effects int
	switch consumer {
	case projection.Name:
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM projection_balances WHERE balance = $1 AND revision = $1`, drainPerAccount).Scan(&effects); err != nil {
			b.Fatal(err)
		}
		if effects != drainAccounts {
			b.Fatalf("%s: %d of %d accounts at balance and revision %d", consumer, effects, drainAccounts, drainPerAccount)
		}
	case auditlog.Name:
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM audit_log`).Scan(&effects); err != nil {
			b.Fatal(err)
		}
		if effects != drainEvents {
			b.Fatalf("%s: %d rows, want %d", consumer, effects, drainEvents)
		}
	}
	if repeats > 0 {
		fmt.Fprintf(os.Stderr, "%s: %d repeated deliveries absorbed\n", consumer, repeats)
	}
}

// deleteGroups deletes the consumer groups of names (each consumer's group
// is its name), so the next run joins fresh groups that start at the
// oldest offset.
func deleteGroups(b *testing.B, brokers []string, names ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	wait.For(b, time.Minute, "the consumer groups to be deleted", func() bool {
		res, err := kadm.NewClient(cl).DeleteGroups(context.Background(), names...)
		if err != nil {
			return false
		}
		for _, r := range res {
			if r.Err != nil && !errors.Is(r.Err, kerr.GroupIDNotFound) {
				return false
			}
		}
		return true
	})
}

// freeAddr is a TCP address on 127.0.0.1 that was free a moment ago.
func freeAddr(b *testing.B) string {
	port, err := faultkit.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}
