package horizon_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// oldDesign is the commit the old design is built from: main before the
// relay's read started at a low-water mark and before the relay reported
// what holds the horizon.
const oldDesign = "3171dac"

// partitions of the dev broker's topics.
const partitions = 16

// config is one run's shape, from the environment (make soak's defaults;
// make bench-horizon sets a short run).
type config struct {
	snapshot time.Duration // how long the snapshot is held (POSTHORN_HORIZON_SNAPSHOT)
	calm     time.Duration // before it and after it (POSTHORN_HORIZON_CALM)
	window   time.Duration // POSTHORN_HORIZON_WINDOW
	rate     int           // events a second through posthorn_publish (POSTHORN_HORIZON_RATE)
	apiRate  int           // postings a second through the API (POSTHORN_HORIZON_API_RATE)
	modes    []string      // relay modes, in order (POSTHORN_HORIZON_MODES)
	oldRev   string        // POSTHORN_HORIZON_OLD
}

func loadConfig(b *testing.B) config {
	c := config{
		snapshot: pgtest.EnvDuration(b, "POSTHORN_HORIZON_SNAPSHOT", 10*time.Minute),
		calm:     pgtest.EnvDuration(b, "POSTHORN_HORIZON_CALM", time.Minute),
		window:   pgtest.EnvDuration(b, "POSTHORN_HORIZON_WINDOW", 30*time.Second),
		rate:     pgtest.EnvInt(b, "POSTHORN_HORIZON_RATE", 1000),
		apiRate:  pgtest.EnvInt(b, "POSTHORN_HORIZON_API_RATE", 100),
		oldRev:   oldDesign,
	}
	if v := os.Getenv("POSTHORN_HORIZON_OLD"); v != "" {
		c.oldRev = v
	}
	modes := os.Getenv("POSTHORN_HORIZON_MODES")
	if modes == "" {
		modes = "polling,cdc"
	}
	for m := range strings.SplitSeq(modes, ",") {
		if m = strings.TrimSpace(m); m != "polling" && m != "cdc" {
			b.Fatalf("POSTHORN_HORIZON_MODES=%q: want polling, cdc or both, comma-separated", modes)
		}
		c.modes = append(c.modes, strings.TrimSpace(m))
	}
	return c
}

// windows counts the run's windows: before the snapshot, while it is held
// (its time rounded up to whole windows), after it.
func (c config) windows() (before, held, after int) {
	n := func(d time.Duration) int { return int((d + c.window - 1) / c.window) }
	return n(c.calm), n(c.snapshot), n(c.calm)
}

// BenchmarkLongSnapshot is the long snapshot of the package doc: for each
// mode, the old design and the tree under test one after the other, each
// on a cluster of its own, then the figures side by side.
//
//	make bench-horizon   # a 90 s snapshot, polling only (under 10 minutes)
//	make soak            # a 10-minute snapshot, polling and CDC (about 50 minutes)
func BenchmarkLongSnapshot(b *testing.B) {
	cfg := loadConfig(b)
	root, dir := repoRoot(b), b.TempDir()
	builds := []build{buildOld(b, root, cfg.oldRev, dir), buildNew(b, root, dir)}
	broker := builds[1].bin
	for range b.N {
		var runs []runResult
		for _, mode := range cfg.modes {
			for _, bd := range builds {
				runs = append(runs, runOnce(b, cfg, bd, broker, mode))
			}
		}
		report(os.Stdout, cfg, builds, runs)
	}
}

// runResult is one build's figures in one mode.
type runResult struct {
	build   build
	mode    string
	windows []windowFigures
	repeats int // records read again (same event ID)
}

func (r runResult) name() string { return r.build.name + " " + r.mode }

type windowFigures struct {
	label        string
	events       int
	p50, p99     time.Duration
	pubRate      float64
	pubP99       time.Duration
	apiRate      float64
	apiP99       time.Duration
	failed       int // publishes and postings that did not commit
	dead         int64
	read, gauge  stmtStats
	mark         stmtStats
	relay, db    float64 // CPU, in cores
	snapshotOpen bool
}

// runOnce runs the whole sequence for one build in one mode.
func runOnce(b *testing.B, cfg config, bd build, brokerBin, mode string) runResult {
	ctx := context.Background()
	name := bd.name + " " + mode
	fmt.Fprintf(os.Stderr, "long snapshot: %s (%s) starting at %s\n", name, bd.rev, time.Now().UTC().Format("15:04:05"))
	logs := b.TempDir()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Logical: true, ExtraConf: map[string]string{
		"shared_preload_libraries": "pg_stat_statements",
		// As production runs: a commit is flushed before it returns, so
		// it reaches the CDC relay's WAL sender at once (pgcluster turns
		// this off for speed).
		"synchronous_commit": "on",
		"max_connections":    "100",
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Stop() }()
	url := createDB(b, c, "ledger")
	env := []string{"POSTHORN_DATABASE__URL=" + url, "POSTHORN_LOG__LEVEL=warn"}
	migrate := exec.Command(bd.bin, "migrate")
	migrate.Env = append(os.Environ(), env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		b.Fatalf("%s: posthorn migrate: %v\n%s", name, err, out)
	}
	probe, err := pgxpool.New(ctx, url+"&pool_max_conns=2&application_name=horizon-probe")
	if err != nil {
		b.Fatal(err)
	}
	defer probe.Close()
	if _, err := probe.Exec(ctx, `CREATE EXTENSION pg_stat_statements`); err != nil {
		b.Fatal(err)
	}

	brokerAddr := freeAddr(b)
	brokerProc := faultkit.NewProc(faultkit.ProcConfig{Name: "broker", Bin: brokerBin, LogDir: logs,
		Args: []string{"dev", "kafka", "--listen", brokerAddr, "--partitions", fmt.Sprint(partitions)}, Env: env,
		ReadyLine: "kafka-protocol broker listening on"})
	start(b, brokerProc)
	defer brokerProc.Close()
	topic := "events." + aggregateType
	createTopics(b, []string{brokerAddr}, partitions, topic, core.TopicEvents)

	metrics, apiAddr := freeAddr(b), freeAddr(b)
	sinkEnv := append(env, "POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS="+brokerAddr)
	relay := faultkit.NewProc(faultkit.ProcConfig{Name: "relay", Bin: bd.bin, Args: []string{"relay"}, LogDir: logs,
		Env:   append(sinkEnv, "POSTHORN_RELAY__MODE="+mode, "POSTHORN_METRICS__LISTEN="+metrics),
		Ready: faultkit.HTTPReady("http://" + metrics + "/readyz")})
	start(b, relay)
	defer relay.Close()
	api := faultkit.NewProc(faultkit.ProcConfig{Name: "api", Bin: bd.bin, Args: []string{"api"}, LogDir: logs,
		Env: append(sinkEnv, "POSTHORN_API__LISTEN="+apiAddr), Ready: faultkit.HTTPReady("http://" + apiAddr + "/readyz")})
	start(b, api)
	defer api.Close()

	rd := newReader(b, []string{brokerAddr}, topic, core.TopicEvents)
	defer rd.close()
	pool, err := pgxpool.New(ctx, url+fmt.Sprintf("&pool_max_conns=%d&application_name=horizon-publishers", publishers))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()

	// Warm up: one event through each path reaches the topic (a CDC
	// relay has made its slot and streams) before the clock starts.
	ids, err := postOne(ctx, newHTTPClient(), apiAddr, `{"entries":[`+
		`{"account":"acc-warm-0","direction":"debit","amount":"1","currency":"EUR"},`+
		`{"account":"acc-warm-1","direction":"credit","amount":"1","currency":"EUR"}]}`)
	if err != nil {
		b.Fatalf("%s: warm-up posting: %v", name, err)
	}
	var warm string
	if err := probe.QueryRow(ctx, `SELECT event_id::text FROM posthorn_publish('order', 'warm', 'order.placed', '{}')`).Scan(&warm); err != nil {
		b.Fatalf("%s: warm-up publish: %v", name, err)
	}
	rd.waitFor(b, name+" (warm-up)", append(ids, warm), 2*time.Minute)

	nBefore, nHeld, nAfter := cfg.windows()
	total := nBefore + nHeld + nAfter
	t0 := time.Now()
	resetStatements(b, probe)
	prev := readStats(b, probe, relay.Pid())
	loadCtx, stopLoad := context.WithCancel(ctx)
	var pubs, posts calls
	pubWG := publish(loadCtx, pool, cfg.rate, &pubs)
	postWG := post(loadCtx, apiAddr, cfg.apiRate, &posts)

	var snapshot pgx.Tx
	stats := make([]dbStats, total)
	cpu := make([][2]float64, total)
	for k := range total {
		if k == nBefore {
			snapshot = holdSnapshot(b, probe)
			fmt.Fprintf(os.Stderr, "long snapshot: %s: snapshot open at %s\n", name, time.Now().UTC().Format("15:04:05"))
		}
		if k == nBefore+nHeld {
			_ = snapshot.Rollback(ctx)
			fmt.Fprintf(os.Stderr, "long snapshot: %s: snapshot closed at %s\n", name, time.Now().UTC().Format("15:04:05"))
		}
		time.Sleep(time.Until(t0.Add(time.Duration(k+1) * cfg.window))) // the window's pace, not a synchronisation
		s := readStats(b, probe, relay.Pid())
		resetStatements(b, probe)
		stats[k] = s
		cpu[k] = [2]float64{(s.relayCPU - prev.relayCPU) / cfg.window.Seconds(), pgtest.CPUSince(prev.dbCPU, s.dbCPU) / cfg.window.Seconds()}
		prev = s
	}
	stopLoad()
	pubWG.Wait()
	postWG.Wait()
	if !relay.Running() || !api.Running() || relay.Crashes()+api.Crashes() > 0 {
		b.Fatalf("%s: the relay or the API exited during the run; relay log:\n%s\napi log:\n%s", name, faultkit.Tail(relay.LogPath(), 20), faultkit.Tail(api.LogPath(), 20))
	}
	if bad := pubs.failed + posts.failed; bad > (len(pubs.list)+len(posts.list))/100 {
		b.Fatalf("%s: %d of %d publishes and postings failed, the first: %v %v", name, bad, len(pubs.list)+len(posts.list), pubs.firstErr, posts.firstErr)
	}
	rd.waitFor(b, name, append(append([]string{}, pubs.ids...), posts.ids...), 5*time.Minute)
	seen, repeats := rd.samples()

	res := runResult{build: bd, mode: mode, repeats: repeats}
	for k := range total {
		from, to := t0.Add(time.Duration(k)*cfg.window), t0.Add(time.Duration(k+1)*cfg.window)
		w := windowFigures{label: windowLabel(k, nBefore, nHeld, cfg.window), dead: stats[k].dead,
			read: stats[k].read, gauge: stats[k].gauge, mark: stats[k].mark,
			relay: cpu[k][0], db: cpu[k][1], snapshotOpen: k >= nBefore && k < nBefore+nHeld}
		var lat []time.Duration
		for _, s := range seen {
			if !s.occurred.Before(from) && s.occurred.Before(to) {
				lat = append(lat, s.lat)
			}
		}
		w.events = len(lat)
		w.p50, w.p99 = percentiles(lat)
		w.pubRate, w.pubP99, w.failed = rateIn(pubs.list, from, to)
		var apiFailed int
		w.apiRate, w.apiP99, apiFailed = rateIn(posts.list, from, to)
		w.failed += apiFailed
		res.windows = append(res.windows, w)
	}
	fmt.Fprintf(os.Stderr, "long snapshot: %s done at %s: %d events published, %d postings, %d records read again\n",
		name, time.Now().UTC().Format("15:04:05"), len(pubs.ids), len(posts.list)-posts.failed, repeats)
	return res
}

// holdSnapshot opens a REPEATABLE READ transaction on a connection of its
// own and takes its snapshot, as a report, pg_dump or an idle-in-transaction
// session would: it holds no transaction ID, only the horizon.
func holdSnapshot(b *testing.B, pool *pgxpool.Pool) pgx.Tx {
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return tx
}

func windowLabel(k, before, held int, w time.Duration) string {
	phase, i := "before", k
	switch {
	case k >= before+held:
		phase, i = "after", k-before-held
	case k >= before:
		phase, i = "snapshot", k-before
	}
	s := int(w.Seconds())
	return fmt.Sprintf("%s %d–%d s", phase, i*s, (i+1)*s)
}

// rateIn is the calls committed per second whose call ended in [from, to),
// their p99 duration, and how many failed there.
func rateIn(list []call, from, to time.Time) (float64, time.Duration, int) {
	var durs []time.Duration
	failed := 0
	for _, c := range list {
		if c.end.Before(from) || !c.end.Before(to) {
			continue
		}
		if !c.ok {
			failed++
			continue
		}
		durs = append(durs, c.dur)
	}
	_, p99 := percentiles(durs)
	return float64(len(durs)) / to.Sub(from).Seconds(), p99, failed
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

func start(b *testing.B, p *faultkit.Proc) {
	if err := p.Start(context.Background()); err != nil {
		b.Fatalf("%s: %v\n%s", p.Name, err, faultkit.Tail(p.LogPath(), 20))
	}
}

// createDB creates database name in c and returns its URL.
func createDB(b *testing.B, c *pgcluster.Cluster, name string) string {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		b.Fatal(err)
	}
	return c.URL(name)
}

func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
