package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// effectClock records, per event ID, when each consumer's handling of it
// returned (after its inbox transaction committed).
type effectClock struct {
	mu     sync.Mutex
	seen   map[string]map[string]time.Time // event ID → consumer → time
	broker map[string]time.Time            // event ID → Kafka record timestamp
}

// middleware is a router-level middleware: it runs around every
// consumer's handler, so it sees the commit of both consumers.
func (c *effectClock) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			now := time.Now()
			consumer := message.HandlerNameFromCtx(msg.Context())
			ts, hasTS := kafkagroup.RecordTimestamp(msg.Context())
			c.mu.Lock()
			if _, ok := c.broker[msg.UUID]; !ok && hasTS {
				c.broker[msg.UUID] = ts
			}
			if c.seen[msg.UUID] == nil {
				c.seen[msg.UUID] = map[string]time.Time{}
			}
			if _, ok := c.seen[msg.UUID][consumer]; !ok {
				c.seen[msg.UUID][consumer] = now
			}
			c.mu.Unlock()
		}
		return out, err
	}
}

// both returns when both consumers had handled id.
func (c *effectClock) both(id string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.seen[id]
	if len(m) < 2 {
		return time.Time{}, false
	}
	var last time.Time
	for _, t := range m {
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// e2ePath is the whole path in one process: the Posting API, the relay
// (Kafka sink) to kfake, both example consumers reading it.
type e2ePath struct {
	url        string
	ledger     *pgxpool.Pool
	consumer   *pgxpool.Pool
	consumerDB string // its database's name
	reg        *consumers.Registry
	clock      *effectClock
}

func startE2EPath(b *testing.B, ctx context.Context) *e2ePath {
	b.Helper()
	brokers := benchKfake(b, kfakebroker.DefaultPartitions)
	ledgerURL, _ := pgtest.Ledger(b)
	apiPool := pgtest.Pool(b, faultkit.WithAppName(ledgerURL, e2eAppAPI), 16)
	url := serveAPI(b, ctx, apiPool)

	relayPool := pgtest.Pool(b, faultkit.WithAppName(ledgerURL, e2eAppRelay), 4)
	sink := sinktest.Open(b, kafka.New, kafka.Config{Brokers: brokers})
	r := startRelay(b, relayPool, sink, relay.Settings{
		Owner: "e2e", SinkName: "kafka", Logger: relayQuietLog, Registerer: prometheus.NewRegistry()})
	b.Cleanup(func() { r.Stop(ctx) }) // runs before the sink closes: cleanups run last registered first

	pool := benchPool(b)
	var consumerDB string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&consumerDB); err != nil {
		b.Fatal(err)
	}
	clock := &effectClock{seen: map[string]map[string]time.Time{}, broker: map[string]time.Time{}}
	reg := newRegistry(b, pool, 30*time.Second, consumers.Config{Logger: relayQuietLog,
		Subscribers: func(consumer string) (message.Subscriber, error) {
			return kafkagroup.Subscriber(brokers, consumer, nil)
		}}, clock.middleware)
	if err := projection.Register(reg, core.TopicEvents); err != nil {
		b.Fatal(err)
	}
	if err := auditlog.Register(reg, core.TopicEvents); err != nil {
		b.Fatal(err)
	}
	runRegistry(b, reg, b.Logf)
	return &e2ePath{url: url, ledger: apiPool, consumer: pool, consumerDB: consumerDB, reg: reg, clock: clock}
}

// serveAPI serves the Posting API on pool's ledger until the benchmark
// ends and returns its URL.
func serveAPI(b *testing.B, ctx context.Context, pool *pgxpool.Pool) string {
	b.Helper()
	srv, err := api.New(api.Config{Logger: relayQuietLog}, ledgerstore.New(pool, ledgerstore.Config{}))
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	apiCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(apiCtx, ln) }()
	b.Cleanup(func() { stop(); <-done })
	return "http://" + ln.Addr().String()
}

// flatOutResult is what flatOut measured.
type flatOutResult struct {
	rate     float64 // postings per second
	postings float64
	took     time.Duration
}

// flatOut posts as fast as workers clients can for d.
func flatOut(ctx context.Context, url, keyPrefix string, workers int, d time.Duration) (flatOutResult, error) {
	loadCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	t0 := time.Now()
	res, err := demo.Load(loadCtx, demo.LoadConfig{BaseURL: url, Postings: 1 << 30, Workers: workers,
		Accounts: 1000, AccountPrefix: "acc-e2e-", KeyPrefix: keyPrefix})
	if err != nil && loadCtx.Err() == nil {
		return flatOutResult{}, err
	}
	took := time.Since(t0)
	return flatOutResult{rate: float64(res.Postings) / took.Seconds(), postings: float64(res.Postings), took: took}, nil
}

// e2eBar is the end-to-end bar: the whole path holds at least this share
// of the Posting API's own rate, measured in the same run, with the
// consumers' lag flat, and commit → both effects p99 stays within
// e2eBarP99 at half the API's rate.
const (
	e2eBarShare = 0.80
	e2eBarP99   = 100 // ms
)

// e2eWorkers is how many HTTP clients post when the path runs flat out.
const e2eWorkers = 32

// BenchmarkConsumerEndToEnd holds the whole path (the Posting API, the
// relay to Kafka, both example consumers) against the Posting API alone,
// in one run:
//
//   - first `posthorn api` alone as a process (a ledger of its own, no
//     relay, no consumer), as fast as 32 clients post, for 20 s: the
//     baseline, with the CPU it and its PostgreSQL backends took;
//   - then the path in this process (the API, the relay to kfake, both
//     consumers) at a steady 500, 1,000 and half the API's own rate, 10 s
//     each: the time from the API's 201 answer (the posting committed) to
//     both consumers' inbox transactions for each of its events having
//     committed, the machine's CPU per posting, and how much of it went to
//     the API's, the relay's and the consumers' PostgreSQL backends and to
//     this process (when PostgreSQL runs on this machine);
//   - then the whole path as processes (`posthorn dev kafka`, `posthorn
//     api`, `posthorn relay`, `posthorn consume`), as fast as 32 API
//     clients post, for a minute, sampling every second the events
//     committed, relayed and applied by each consumer: its highest steady
//     rate, which stage limits it (a stage whose lag at the end is more
//     than twice its lag at half time), that rate as a share of the API's
//     own, and the machine's CPU split between the processes (each child's
//     /proc/<pid>/stat, the PostgreSQL backends of each, this process's
//     load generator, and the rest of the machine).
//
// It prints the bar's verdict; a benchmark reports, it does not fail on a
// figure.
func BenchmarkConsumerEndToEnd(b *testing.B) {
	ctx := context.Background()
	apiRate, apiCPU := apiAloneProcess(b, ctx)
	fmt.Printf("end to end, `posthorn api` alone (no relay, no consumer), %d clients for 20 s: %.0f postings/s; CPU per posting: %s\n",
		e2eWorkers, apiRate, apiCPU)
	b.ReportMetric(apiRate, "api-alone-postings/s")

	p := startE2EPath(b, ctx)
	// Every consumer has joined its group before the measured load.
	if _, err := demo.Load(ctx, demo.LoadConfig{BaseURL: p.url, Postings: 20, Accounts: 1000, AccountPrefix: "acc-warm-", KeyPrefix: "warm-"}); err != nil {
		b.Fatal(err)
	}
	waitCaughtUp(b, ctx, p.progress, 2*time.Minute)

	// 500 and 1,000 postings/s, as points of comparison with earlier runs,
	// then the bar's: half the API's own rate.
	half := max(int(apiRate/2), 1)
	var halfP99 float64
	for _, rate := range []int{500, 1000, half} {
		p99 := steadyLatency(b, ctx, p, rate)
		if rate == half {
			halfP99 = p99
			b.ReportMetric(p99, "e2e-p99-ms-at-half-api-rate")
			continue
		}
		b.ReportMetric(p99, "e2e-p99-ms-at-"+strconv.Itoa(rate))
	}

	pathRate, lagFlat := flatOutProcesses(b, ctx, apiRate)
	share := pathRate / apiRate
	b.ReportMetric(share, "path/api-alone")
	verdict := func(ok bool) string {
		if ok {
			return "holds"
		}
		return "MISSED"
	}
	fmt.Printf("end-to-end bar: the whole path %.0f postings/s = %.2f of the Posting API's own %.0f (bar %.2f: %s); lag flat: %s; p99 commit → both effects at half the API's rate (%d/s) %.1f ms (bar %d ms: %s)\n",
		pathRate, share, apiRate, e2eBarShare, verdict(share >= e2eBarShare), verdict(lagFlat), half, halfP99, e2eBarP99, verdict(halfP99 <= e2eBarP99))
}

// steadyLatency posts at rate postings/s for 10 s, waits until both
// consumers caught up, prints the latency from each posting's commit (the
// API's 201) to both consumers' effects of each of its events committed,
// and returns its p99 in ms.
func steadyLatency(b *testing.B, ctx context.Context, p *e2ePath, rate int) float64 {
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
	)
	cpu0, parts0 := readMachineCPU(b), readPartsCPU(b, p)
	start := time.Now()
	res, err := demo.Load(ctx, demo.LoadConfig{BaseURL: p.url, Postings: 10 * rate, Rate: float64(rate), Workers: 32,
		Accounts: 1000, AccountPrefix: "acc-e2e-", KeyPrefix: "steady-" + strconv.Itoa(rate) + "-",
		OnPosted: func(r core.PostingResult) {
			now := time.Now()
			mu.Lock()
			for _, e := range r.Events {
				committed[e.EventID] = now
			}
			mu.Unlock()
		}})
	if err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	waitCaughtUp(b, ctx, p.progress, 3*time.Minute)
	cpu, parts := readMachineCPU(b).since(cpu0), readPartsCPU(b, p).since(parts0)
	var lat, toBroker, fromBroker []time.Duration
	for id, c := range committed {
		t, ok := p.clock.both(id)
		if !ok {
			b.Fatalf("event %s not applied by both consumers", id)
		}
		lat = append(lat, max(t.Sub(c), 0))
		p.clock.mu.Lock()
		if ts, ok := p.clock.broker[id]; ok {
			toBroker, fromBroker = append(toBroker, max(ts.Sub(c), 0)), append(fromBroker, max(t.Sub(ts), 0))
		}
		p.clock.mu.Unlock()
	}
	for _, l := range [][]time.Duration{lat, toBroker, fromBroker} {
		slices.Sort(l)
	}
	pct := func(l []time.Duration, q int) float64 {
		if len(l) == 0 {
			return 0
		}
		return ms(l[min(len(l)*q/100, len(l)-1)])
	}
	fmt.Printf("end to end, API commit to both consumers' effect committed, at %.0f postings/s (%d asked; %d postings, %d events): p50 %.1f ms, p99 %.1f ms, max %.1f ms (commit to Kafka record p50 %.1f / p99 %.1f ms, record to both effects p50 %.1f / p99 %.1f ms)\n",
		float64(res.Postings)/elapsed.Seconds(), rate, res.Postings, res.Events, pct(lat, 50), pct(lat, 99), ms(lat[len(lat)-1]),
		pct(toBroker, 50), pct(toBroker, 99), pct(fromBroker, 50), pct(fromBroker, 99))
	fmt.Printf("end to end at %d postings/s asked: the machine's CPU %.0f%% busy from the first posting until both consumers caught up, %.1f ms of CPU per posting\n",
		rate, 100*cpu.busyShare(), cpu.busySeconds()*1000/float64(res.Postings))
	perPosting := func(secs float64) float64 { return secs * 1000 / float64(res.Postings) }
	if parts[partAPI] > 0 { // PostgreSQL runs on this machine
		// The rest of the machine's busy time is other processes and the
		// kernel; it is not printed as a difference because the two
		// readings are not taken at the same instant.
		fmt.Printf("end to end at %d postings/s asked, CPU per posting by part: %s %.2f ms, %s %.2f, %s %.2f, %s %.2f\n",
			rate, partAPI, perPosting(parts[partAPI]), partConsumers, perPosting(parts[partConsumers]),
			partRelay, perPosting(parts[partRelay]), partSelf, perPosting(parts[partSelf]))
	}
	return pct(lat, 99)
}

// e2eProgress reads how far each stage of a path is: its ledger's events
// relayed and its consumers' applied.
func e2eProgress(b *testing.B, ctx context.Context, ledger, consumer *pgxpool.Pool) demo.Progress {
	b.Helper()
	pr, err := demo.ReadProgress(ctx, ledger, consumer, []string{projection.Name, auditlog.Name})
	if err != nil {
		b.Fatal(err)
	}
	return pr
}

func (p *e2ePath) progress(b *testing.B, ctx context.Context) demo.Progress {
	return e2eProgress(b, ctx, p.ledger, p.consumer)
}

// waitCaughtUp waits until progress says every event is relayed and
// applied, within d.
func waitCaughtUp(b *testing.B, ctx context.Context, progress func(*testing.B, context.Context) demo.Progress, d time.Duration) {
	b.Helper()
	// Every 50 ms: the progress is read with counts, beside the path whose
	// CPU is measured.
	if !wait.UntilEvery(d, 50*time.Millisecond, func() (bool, string) { return progress(b, ctx).Delivered(), "" }) {
		b.Fatalf("consumers not caught up after %s: %+v", d, progress(b, ctx))
	}
}

// machineCPU is the whole machine's busy and total time, in seconds
// (pgtest.MachineCPU). Everything the end-to-end path runs (PostgreSQL,
// the bench process) is on this machine, and idle it stays under a few
// percent.
type machineCPU struct{ busy, total float64 }

func readMachineCPU(b *testing.B) machineCPU {
	b.Helper()
	var c machineCPU
	c.busy, c.total = pgtest.MachineCPU(b)
	return c
}

func (c machineCPU) since(before machineCPU) machineCPU {
	return machineCPU{busy: c.busy - before.busy, total: c.total - before.total}
}

func (c machineCPU) busyShare() float64 { return c.busy / max(c.total, 0.01) }

func (c machineCPU) busySeconds() float64 { return c.busy }

// The application names of the end-to-end path's ledger pools, which tell
// their backends apart; the consumers' backends are those of the consumer
// database.
const (
	e2eAppAPI   = "posthorn-e2e-api"
	e2eAppRelay = "posthorn-e2e-relay"
)

// The parts of the path whose CPU the benchmark reports.
const (
	partAPI       = "the API's PostgreSQL"
	partConsumers = "the consumers' PostgreSQL"
	partRelay     = "the relay's PostgreSQL"
	partSelf      = "this process (API, relay, kfake, both consumers, the load generator)"
)

// partsCPU is each part's CPU time so far, in seconds: part → PID →
// seconds.
type partsCPU map[string]map[int]float64

// readPartsCPU reads the CPU time of this process and of every backend of
// the path's pools (pgtest.BackendCPU: PostgreSQL must run on this
// machine, or the backends' maps stay empty).
func readPartsCPU(b *testing.B, p *e2ePath) partsCPU {
	b.Helper()
	const byApp = `SELECT pid FROM pg_stat_activity WHERE application_name = $1`
	self, ok := pgtest.ProcessCPU(os.Getpid())
	if !ok {
		b.Fatal("cannot read this process's /proc/<pid>/stat")
	}
	return partsCPU{
		partAPI:       pgtest.BackendCPU(b, p.ledger, byApp, e2eAppAPI),
		partRelay:     pgtest.BackendCPU(b, p.ledger, byApp, e2eAppRelay),
		partConsumers: pgtest.BackendCPU(b, p.ledger, `SELECT pid FROM pg_stat_activity WHERE datname = $1`, p.consumerDB),
		partSelf:      {os.Getpid(): self},
	}
}

// since returns each part's CPU seconds from before to c.
func (c partsCPU) since(before partsCPU) map[string]float64 {
	out := map[string]float64{}
	for part, after := range c {
		out[part] = pgtest.CPUSince(before[part], after)
	}
	return out
}
