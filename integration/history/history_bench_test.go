package history

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/adapters/fsarchive"
	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// The fixed work every database gets, sized so that `make bench-history`
// (the empty database and 1M events, loads included) stays under 10
// minutes on a 2-core machine.
const (
	// writePostings two-line postings by writers concurrent writers: the
	// write path, then the relay's drain of their events.
	writePostings = 8000
	writers       = 8
	// latencyRate postings/s for latencyPeriod by latencyWriters, with the
	// relay running: its commit-to-ACK latency.
	latencyRate    = 200
	latencyPeriod  = 10 * time.Second
	latencyWriters = 4
	// laterPostings are posted after the first cleanup, for the second,
	// incremental pass of the operations.
	laterPostings = 1000
)

var (
	names = []string{projection.Name, auditlog.Name}
	quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
)

// BenchmarkHistory: see the package documentation. One round is the
// measurement whatever b.N is (it loads the databases, and the operations
// change them).
func BenchmarkHistory(b *testing.B) {
	pgtest.Require1M(b, "loads POSTHORN_HISTORY_EVENTS events of history (1,000,000 by default: minutes)")
	events := pgtest.EnvInt(b, "POSTHORN_HISTORY_EVENTS", 1_000_000)
	start := time.Now()
	empty := measure(b, 0)
	full := measure(b, events)
	printTable(empty, full, events)
	fmt.Printf("BenchmarkHistory: the whole run (both sizes, loads included) took %.0fs\n", time.Since(start).Seconds())
}

// figure is one measured value.
type figure struct {
	name   string // what, and its unit
	metric string // its b.ReportMetric unit, without the size
	value  float64
	// rate: higher is better; otherwise (a duration) lower is.
	rate bool
	// value is NaN when the figure could not be measured (recorder.failed).
}

// recorder prints each figure as it is measured, reports it as a metric
// and keeps it for the table.
type recorder struct {
	b    *testing.B
	size int
	figs []figure
}

func (r *recorder) add(f figure, detail string) {
	fmt.Printf("BenchmarkHistory %d events: %-46s %10.2f  (%s)\n", r.size, f.name, f.value, detail)
	r.b.ReportMetric(f.value, fmt.Sprintf("%s@%d", f.metric, r.size))
	r.figs = append(r.figs, f)
}

// failed records that the figure could not be measured, and why.
func (r *recorder) failed(name, why string) {
	fmt.Printf("BenchmarkHistory %d events: %-46s %10s  (%s)\n", r.size, name, "failed", why)
	r.figs = append(r.figs, figure{name: name, value: math.NaN()})
}

func (r *recorder) rate(name, metric string, n int, d time.Duration) {
	r.add(figure{name: name, metric: metric, value: float64(n) / d.Seconds(), rate: true}, fmt.Sprintf("%d in %.2fs", n, d.Seconds()))
}

// op records an operation over rows rows that took took: its duration
// and, with perRow, its rate (a pass over the whole history takes longer
// by nature; its rate says whether each row costs more).
func (r *recorder) op(name, metric string, rows int, took time.Duration, perRow bool, detail string) {
	r.add(figure{name: name + " (s)", metric: metric + "-s", value: took.Seconds()}, detail)
	if perRow {
		r.rate(name+" (rows/s)", metric+"-rows/s", rows, took)
	}
}

// measure loads a ledger and a consumer database with size events of
// history and runs every measurement on them, in this order: the write
// path; the relay's drain of what it posted; the relay's commit-to-ACK
// latency under a paced load; both example consumers applying all of it;
// the failover check, reconcile, archive and cleanup over everything
// (the first pass: the history was never archived); then, after
// laterPostings more postings are relayed and applied, reconcile, archive
// and cleanup again (the incremental pass an operator's schedule runs);
// last, after laterPostings more, the failover check from the marks that
// pass recorded and whole.
func measure(b *testing.B, size int) []figure {
	ctx := context.Background()
	_, ledger := pgtest.Ledger(b)
	consumerURL, consumer := pgtest.Consumer(b)
	rec := &recorder{b: b, size: size}
	start := time.Now()
	load(b, ledger, consumer, size)
	fmt.Printf("BenchmarkHistory %d events: loaded (ledger and consumer database, vacuumed) in %.1fs\n", size, time.Since(start).Seconds())

	store := ledgerstore.New(ledger, ledgerstore.Config{})
	took := postConcurrently(b, store, "write", writePostings, writers)
	rec.rate("write path, 8 writers (postings/s)", "write-postings/s", writePostings, took)

	brokers := kfakeBrokers(b)
	ks, err := kafka.New(kafka.Config{Brokers: brokers})
	if err != nil {
		b.Fatal(err)
	}
	defer ks.Close()
	acks := relaytest.NewAckTimes(ks)
	r, err := polling.New(relaystore.New(ledger), acks, relay.Settings{Owner: "history", SinkName: "kafka", Logger: quiet,
		Registerer: prometheus.NewRegistry(), StatsInterval: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := r.Stop(ctx); err != nil {
			b.Errorf("stop the relay: %v", err)
		}
	}()
	waitDrained(b, ledger)
	rec.rate("relay drain to kfake (events/s)", "drain-events/s", 2*writePostings, time.Since(start))

	lat, latPostings := commitToAck(b, store, acks)
	p50, p99 := relaytest.Percentiles(lat)
	rec.add(figure{name: "relay commit-to-ACK p99 (ms)", metric: "ack-p99-ms", value: ms(p99)},
		fmt.Sprintf("%d postings at %d/s, p50 %.1f ms, max %.1f ms", latPostings, latencyRate, ms(p50), ms(lat[len(lat)-1])))

	fresh := 2 * (writePostings + latPostings)
	blocks0 := blocksRead(b, consumer)
	apply := startConsumers(b, consumerURL, brokers)
	clocks := apply.wait(b, consumer, fresh, size+fresh)
	misses := blocksRead(b, consumer).since(blocks0)
	for _, n := range names {
		rec.add(figure{name: n + " apply (events/s)", metric: n + "-events/s", value: float64(fresh) / clocks[n].Seconds(), rate: true},
			fmt.Sprintf("%d in %.2fs; the consumer database, both consumers: %s", fresh, clocks[n].Seconds(), misses.per(2*fresh)))
	}

	opsStore := opsstore.New(ledger)
	in := inboxstore.New(consumer)
	failover := ops.FailoverConfig{Ledger: opsstore.NewFailoverStore(ledger), Margin: 1000, Sources: []ops.SeenSource{
		opsstore.InboxSeen{Pool: consumer, Consumer: projection.Name},
		opsstore.InboxSeen{Pool: consumer, Consumer: auditlog.Name},
		opsstore.AuditLogSeen{Pool: consumer, Consumer: auditlog.Name},
	}}
	view, err := opsstore.NewBalanceView(consumer, projection.BalanceView)
	if err != nil {
		b.Fatal(err)
	}
	sources := []ops.ConsumerSource{
		{Name: projection.Name, Reader: ops.InboxReader{Inbox: in, Consumer: projection.Name}, BalanceView: view},
		{Name: auditlog.Name, Reader: ops.InboxReader{Inbox: in, Consumer: auditlog.Name}},
	}
	archive, err := fsarchive.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}

	total := size + fresh
	failoverCheck(b, rec, failover, "failover check", "failover", total, true)
	if err := reconcile(b, rec, ops.ReconcileConfig{Ledger: opsStore, Consumers: sources, Record: true},
		"reconcile, first pass", "reconcile", total, true); err != nil {
		b.Fatalf("reconcile, first pass: %v", err)
	}
	runArchive(b, rec, ops.ArchiveConfig{Ledger: opsStore, Archive: archive, Required: names}, "archive, first pass", "archive", total, true)
	runCleanup(b, rec, ops.CleanupConfig{Ledger: opsStore, Archive: archive, Required: names}, "cleanup, first pass", "cleanup", total, true)

	// The incremental pass: what an operator's schedule runs once the
	// history is archived and cleaned up.
	postConcurrently(b, store, "later", laterPostings, writers)
	waitDrained(b, ledger)
	apply.wait(b, consumer, fresh+2*laterPostings, total+2*laterPostings)
	// Reconcile looks up every inbox event ID its cut does not hold, and
	// the history's are gone from the outbox: it reads them in the archive.
	// Should it fail, that is a figure (failed, and why), and archive and
	// cleanup, which need the coverage a clean reconcile records, are then
	// not run.
	if err := reconcile(b, rec, ops.ReconcileConfig{Ledger: opsStore, Consumers: sources, Archive: archive, Record: true},
		"reconcile, next pass", "reconcile-next", 2*laterPostings, false); err != nil {
		rec.failed("reconcile, next pass (s)", err.Error())
		rec.failed("archive, next pass (s)", "not run: the reconcile before it recorded no coverage")
		rec.failed("cleanup, next pass (s)", "not run: the reconcile before it recorded no coverage")
	} else {
		// The same pass with the marks set aside, as it ran before there
		// were any: every inbox event ID looked up, the cleaned ones in the
		// archive.
		if err := reconcile(b, rec, ops.ReconcileConfig{Ledger: opsStore, Consumers: sources, Archive: archive, Full: true},
			"reconcile, next pass, full", "reconcile-next-full", 2*laterPostings, false); err != nil {
			rec.failed("reconcile, next pass, full (s)", err.Error())
		}
		runArchive(b, rec, ops.ArchiveConfig{Ledger: opsStore, Archive: archive, Required: names}, "archive, next pass", "archive-next", 2*laterPostings, false)
		runCleanup(b, rec, ops.CleanupConfig{Ledger: opsStore, Archive: archive, Required: names}, "cleanup, next pass", "cleanup-next", 2*laterPostings, false)
	}
	// The check once a clean pass has recorded marks and laterPostings
	// more were applied since: each source is read from its mark (the
	// ledger holds the pass's witness), then whole.
	postConcurrently(b, store, "since", laterPostings, writers)
	waitDrained(b, ledger)
	apply.wait(b, consumer, fresh+4*laterPostings, total+4*laterPostings)
	failoverCheck(b, rec, failover, "failover check after cleanup, from the marks", "failover-next", total+4*laterPostings, false)
	failover.Whole = true
	failoverCheck(b, rec, failover, "failover check after cleanup, whole", "failover-next-whole", total+4*laterPostings, false)
	apply.stop()
	return rec.figs
}

// posting is the i-th two-line posting of a phase: 7 EUR from one loaded
// account to the one half the accounts away.
func posting(i int) core.Posting {
	a := i * 7919 % accounts
	return core.Posting{Entries: []core.Entry{
		{Account: fmt.Sprintf("acc-%d", a), Direction: core.Debit, Amount: 7, Currency: "EUR"},
		{Account: fmt.Sprintf("acc-%d", (a+accounts/2)%accounts), Direction: core.Credit, Amount: 7, Currency: "EUR"},
	}}
}

// postConcurrently posts n postings (keys <phase>-<i>) from w writers and
// returns how long it took.
func postConcurrently(b *testing.B, store *ledgerstore.Store, phase string, n, w int) time.Duration {
	ctx := context.Background()
	errs := make(chan error, w)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range w {
		wg.Go(func() {
			for i := g; i < n; i += w {
				if _, _, err := store.Post(ctx, fmt.Sprintf("%s-%d", phase, i), posting(i)); err != nil {
					errs <- fmt.Errorf("post %s-%d: %w", phase, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return took
}

// commitToAck posts latencyRate postings/s for latencyPeriod from
// latencyWriters writers while the relay runs, and returns, sorted, the
// time from each event's commit returning to the sink's ACK of it, and how
// many postings were committed.
func commitToAck(b *testing.B, store *ledgerstore.Store, acks *relaytest.AckTimes) ([]time.Duration, int) {
	ctx := context.Background()
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		failed    error
		tokens    = make(chan int, latencyRate)
		wg        sync.WaitGroup
	)
	for range latencyWriters {
		wg.Go(func() {
			for i := range tokens {
				res, _, err := store.Post(ctx, fmt.Sprintf("latency-%d", i), posting(writePostings+i))
				now := time.Now()
				mu.Lock()
				if err != nil && failed == nil {
					failed = fmt.Errorf("post latency-%d: %w", i, err)
				}
				for _, e := range res.Events {
					committed[e.EventID] = now
				}
				mu.Unlock()
			}
		})
	}
	// A token every 1/latencyRate s; a token the writers are too slow to
	// take is dropped, and the achieved count is what is reported.
	tick := time.NewTicker(time.Second / latencyRate)
	end := time.Now().Add(latencyPeriod)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		select {
		case tokens <- i:
		default:
		}
	}
	tick.Stop()
	close(tokens)
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	return acks.WaitLatencies(b, committed), len(committed) / 2
}

// waitDrained waits until the ledger has no unrelayed row.
func waitDrained(b *testing.B, ledger *pgxpool.Pool) {
	wait.For(b, 5*time.Minute, "the relay to drain the outbox", func() bool {
		var pending bool
		if err := ledger.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM outbox_pending)`).Scan(&pending); err != nil {
			b.Fatalf("read the relay's backlog: %v", err)
		}
		return !pending
	})
}

func failoverCheck(b *testing.B, rec *recorder, cfg ops.FailoverConfig, name, metric string, events int, perRow bool) {
	start := time.Now()
	rep, err := ops.FailoverCheck(context.Background(), cfg)
	took := time.Since(start)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	if !rep.Clean() {
		b.Fatalf("%s: want clean, got %d read, lost %d, plan %+v", name, rep.Read, len(rep.Lost), rep.Plan)
	}
	marks := 0
	for _, s := range rep.Sources {
		if s.SinceMark > 0 {
			marks++
		}
	}
	// Read from marks only after a clean pass recorded them, and then
	// every source (the ledger holds the witness), reading less.
	switch fromMarks := strings.Contains(name, "from the marks"); {
	case !fromMarks && (marks > 0 || rep.Read != 3*events):
		b.Fatalf("%s: want every event of 3 sources read whole (%d), got %d read, %d sources from a mark", name, 3*events, rep.Read, marks)
	case fromMarks && (marks != 3 || rep.Read < 3*2*laterPostings || rep.Read >= 3*events):
		b.Fatalf("%s: want 3 sources read from their marks, the %d events applied since at least and fewer than the %d they hold, got %d read: %+v",
			name, 3*2*laterPostings, 3*events, rep.Read, rep.Sources)
	}
	rec.op(name, metric, rep.Read, took, perRow, fmt.Sprintf("%d events read, 3 sources (%d from a mark), clean", rep.Read, marks))
}

// reconcile runs and records a reconcile that must be clean with events
// events expected per consumer; an error of Reconcile itself (it could not
// run) is returned, for the caller to decide.
func reconcile(b *testing.B, rec *recorder, cfg ops.ReconcileConfig, name, metric string, events int, perRow bool) error {
	start := time.Now()
	rep, err := ops.Reconcile(context.Background(), cfg)
	took := time.Since(start)
	if err != nil {
		return fmt.Errorf("after %.2fs: %w", took.Seconds(), err)
	}
	if !rep.Clean || rep.Consumers[0].Expected != int64(events) || rep.Consumers[1].Expected != int64(events) {
		b.Fatalf("%s: want clean with %d events expected per consumer: %+v", name, events, rep)
	}
	history := "whole histories"
	if rep.Consumers[0].Pass.SinceMark > 0 {
		history = "histories since the marks"
	}
	rec.op(name, metric, events, took, perRow, fmt.Sprintf("%d events in the cut, %s, %d ledger events proved, %d balances compared, %.2fs waiting for the cut, clean",
		rep.Consumers[0].Expected, history, rep.Ledger.Events, rep.Consumers[0].BalanceView.Compared, rep.Cut.WaitedSeconds))
	return nil
}

func runArchive(b *testing.B, rec *recorder, cfg ops.ArchiveConfig, name, metric string, rows int, perRow bool) {
	start := time.Now()
	res, err := ops.Archive(context.Background(), cfg)
	took := time.Since(start)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	if res.Rows != int64(rows) {
		b.Fatalf("%s: archived %d rows, want %d", name, res.Rows, rows)
	}
	rec.op(name, metric, rows, took, perRow, fmt.Sprintf("%d rows in %d segments", res.Rows, len(res.Segments)))
}

func runCleanup(b *testing.B, rec *recorder, cfg ops.CleanupConfig, name, metric string, rows int, perRow bool) {
	start := time.Now()
	res, err := ops.Cleanup(context.Background(), cfg)
	took := time.Since(start)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	if res.Deleted != int64(rows) {
		b.Fatalf("%s: deleted %d rows, want %d: %+v", name, res.Deleted, rows, res)
	}
	rec.op(name, metric, rows, took, perRow, fmt.Sprintf("%d rows in %d batches", res.Deleted, res.Batches))
}

func kfakeBrokers(b *testing.B) []string {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(16, core.TopicEvents))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c.ListenAddrs()
}

// consumerRun is both example consumers with the inbox, as `posthorn
// consume` runs them, reading ledger.events from the start.
type consumerRun struct {
	clocks map[string]*relaytest.ApplyClock
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	b      *testing.B
}

func startConsumers(b *testing.B, url string, brokers []string) *consumerRun {
	pool := pgtest.Pool(b, url, 8)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	reg, err := consumers.New(router, consumers.Config{Pool: pool, Inbox: inboxstore.New(pool), Logger: quiet,
		Subscribers: func(consumer string) (message.Subscriber, error) {
			return kafkagroup.Subscriber(brokers, consumer+"-history", nil)
		}})
	if err != nil {
		b.Fatal(err)
	}
	run := &consumerRun{clocks: map[string]*relaytest.ApplyClock{}, done: make(chan error, 1), b: b}
	handlers := map[string]consumers.Handler{projection.Name: projection.Handle, auditlog.Name: auditlog.Handle}
	batches := map[string]consumers.BatchHandler{projection.Name: projection.HandleBatch, auditlog.Name: auditlog.HandleBatch}
	for _, n := range names {
		c := &relaytest.ApplyClock{}
		run.clocks[n] = c
		h, bh := handlers[n], batches[n]
		opts := []consumers.Option{consumers.WithBatchHandler(func(ctx context.Context, tx pgx.Tx, es []core.Envelope) error {
			if err := bh(ctx, tx, es); err != nil {
				return err
			}
			c.Tick(len(es))
			return nil
		})}
		if n == projection.Name {
			opts = append(opts, consumers.DependsOnPredecessor())
		}
		if err := reg.AddEventHandler(n, core.TopicEvents, func(ctx context.Context, tx pgx.Tx, e core.Envelope) error {
			if err := h(ctx, tx, e); err != nil {
				return err
			}
			c.Tick(1)
			return nil
		}, opts...); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	run.cancel = cancel
	go func() { run.done <- reg.Run(ctx) }()
	b.Cleanup(run.stop)
	return run
}

// wait waits until each consumer's handler has applied handled events
// since the run started and its inbox holds inbox applied rows, and
// returns each consumer's time from its first applied event to its last.
func (r *consumerRun) wait(b *testing.B, pool *pgxpool.Pool, handled, inbox int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, n := range names {
		c := r.clocks[n]
		wait.For(b, 5*time.Minute, n+" to apply every event", func() bool {
			return c.Reached(handled)
		})
		// The inbox is asked only once the handler has seen every event:
		// its count reads the whole inbox.
		ok := wait.UntilEvery(time.Minute, 200*time.Millisecond, func() (bool, string) {
			var applied int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM consumer_inbox WHERE consumer = $1 AND disposition = 'applied'`,
				n).Scan(&applied); err != nil {
				b.Fatalf("count %s's inbox: %v", n, err)
			}
			return applied == inbox, ""
		})
		if !ok {
			b.Fatalf("%s: its inbox does not hold %d applied events", n, inbox)
		}
		out[n] = c.Span()
	}
	return out
}

// blockCounts are a database's block requests so far (pg_stat_database):
// those PostgreSQL's shared buffers answered and those it read from the
// kernel (its page cache or the disk).
type blockCounts struct{ read, hit int64 }

// blocksRead reads pool's database's block counts once every backend has
// reported its own: a backend reports at most once a second while busy and
// within ten seconds once idle, so the counts are read until they have not
// moved for two seconds (at most 15).
func blocksRead(b *testing.B, pool *pgxpool.Pool) blockCounts {
	var last blockCounts
	stable := 0
	wait.UntilEvery(15*time.Second, time.Second, func() (bool, string) {
		var c blockCounts
		if err := pool.QueryRow(context.Background(),
			`SELECT blks_read, blks_hit FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.read, &c.hit); err != nil {
			b.Fatalf("read the consumer database's block counts: %v", err)
		}
		if c.read != last.read {
			stable = 0
		} else {
			stable++
		}
		last = c
		return stable == 2, ""
	})
	return last
}

func (c blockCounts) since(before blockCounts) blockCounts {
	return blockCounts{read: c.read - before.read, hit: c.hit - before.hit}
}

// per says how many blocks were read from outside shared buffers per
// applied event, and the share of all block requests the buffers answered.
func (c blockCounts) per(events int) string {
	return fmt.Sprintf("%.2f blocks read from outside shared buffers per applied event, %.1f%% of block requests answered in them",
		float64(c.read)/float64(events), 100*float64(c.hit)/float64(max(c.read+c.hit, 1)))
}

func (r *consumerRun) stop() {
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
			r.b.Errorf("consumers: %v", err)
		}
	})
}

// printTable prints each figure for both sizes and their ratio. A figure
// is flagged when the loaded database makes it more than 1.5 times worse:
// well beyond what this benchmark's fixed counts vary by between runs.
func printTable(empty, full []figure, events int) {
	fmt.Printf("\nBenchmarkHistory: each figure on an empty database and on one with %d events of history\n", events)
	fmt.Printf("| %-46s | %12s | %12s | %8s | %-13s | %s\n", "figure", "0 events", fmt.Sprintf("%d events", events), "N/0", "worse when", "")
	for i, e := range empty {
		f := full[i]
		if math.IsNaN(e.value) || math.IsNaN(f.value) {
			fmt.Printf("| %-46s | %12s | %12s | %8s | %-13s | %s\n", e.name, value(e), value(f), "–", "", "failed: see above")
			continue
		}
		ratio := f.value / e.value
		worse, factor := "N/0 above 1", ratio
		if e.rate {
			worse, factor = "N/0 below 1", 1/ratio
		}
		flag := ""
		if factor > 1.5 {
			flag = fmt.Sprintf("grows with history (%.1fx worse)", factor)
		}
		fmt.Printf("| %-46s | %12.2f | %12.2f | %8.2f | %-13s | %s\n", e.name, e.value, f.value, ratio, worse, flag)
	}
}

// value is f's value for the table, or "failed".
func value(f figure) string {
	if math.IsNaN(f.value) {
		return "failed"
	}
	return fmt.Sprintf("%.2f", f.value)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
