package integration

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// e2eProcAPI is the application name of `posthorn api`'s sessions in the
// end-to-end benchmark's path as processes, which tells its PostgreSQL
// backends apart (the relay names its own; the consumers' are those of
// their database).
const e2eProcAPI = "posthorn-e2e-proc-api"

// cpuMeter reads the CPU of the parts of a run: child processes, the
// PostgreSQL backends a query lists, this process, and the whole machine.
type cpuMeter struct {
	procs    []*faultkit.Proc
	backends []backendPart
}

type backendPart struct {
	name  string
	probe *pgxpool.Pool
	query string
	args  []any
}

// cpuReading is one reading of a cpuMeter: part → CPU seconds so far (the
// backends' per PID, so that a backend that started between two readings
// counts from zero), and the machine's.
type cpuReading struct {
	procs    map[string]float64
	backends map[string]map[int]float64
	self     float64
	machine  machineCPU
}

func (m *cpuMeter) read(b *testing.B) cpuReading {
	b.Helper()
	r := cpuReading{procs: map[string]float64{}, backends: map[string]map[int]float64{}, machine: readMachineCPU(b)}
	for _, p := range m.procs {
		r.procs[p.Name], _ = pgtest.ProcessCPU(p.Pid())
	}
	for _, bp := range m.backends {
		r.backends[bp.name] = pgtest.BackendCPU(b, bp.probe, bp.query, bp.args...)
	}
	r.self, _ = pgtest.ProcessCPU(os.Getpid())
	return r
}

// cpuSplit is what each part used between two readings, in seconds of
// CPU, largest first; the machine's busy seconds, and what the parts do not
// account for (other processes on the machine, the kernel, PostgreSQL's
// own background processes).
type cpuSplit struct {
	parts   []cpuPart
	busy    float64
	elapsed time.Duration
}

type cpuPart struct {
	name string
	secs float64
}

func (r cpuReading) since(before cpuReading, elapsed time.Duration) cpuSplit {
	s := cpuSplit{busy: r.machine.since(before.machine).busySeconds(), elapsed: elapsed}
	for name, v := range r.procs {
		s.parts = append(s.parts, cpuPart{name, v - before.procs[name]})
	}
	for name, v := range r.backends {
		s.parts = append(s.parts, cpuPart{name, pgtest.CPUSince(before.backends[name], v)})
	}
	s.parts = append(s.parts, cpuPart{"this process (the load generator's clients)", r.self - before.self})
	sort.Slice(s.parts, func(i, j int) bool { return s.parts[i].secs > s.parts[j].secs })
	return s
}

// String prints each part's CPU seconds, share of the machine's busy time
// and cores' worth, then the rest of the machine.
func (s cpuSplit) String() string {
	var out strings.Builder
	var parts float64
	for _, p := range s.parts {
		parts += p.secs
		fmt.Fprintf(&out, "\n    %-50s %6.1f s CPU, %5.1f%% of the machine's busy time, %.2f cores", p.name, p.secs, 100*p.secs/s.busy, p.secs/s.elapsed.Seconds())
	}
	rest := max(s.busy-parts, 0)
	fmt.Fprintf(&out, "\n    %-50s %6.1f s CPU, %5.1f%% (other processes on the machine, the kernel, PostgreSQL's background writers)",
		"the rest", rest, 100*rest/s.busy)
	fmt.Fprintf(&out, "\n    %-50s %6.1f s CPU of %.1f s on %d cores", "the machine, busy", s.busy, s.elapsed.Seconds(), runtime.NumCPU())
	return out.String()
}

// apiAloneProcess runs `posthorn api` alone on a ledger of its own as fast
// as e2eWorkers clients post, for 20 s, and returns its rate and its CPU
// per posting by part.
func apiAloneProcess(b *testing.B, ctx context.Context) (float64, string) {
	b.Helper()
	ledgerURL, ledger := pgtest.Ledger(b)
	bin, dir := posthornBin(b), b.TempDir()
	apiURL := "http://" + freeAddr(b)
	api := faultkit.NewProc(faultkit.ProcConfig{Name: "posthorn api", Bin: bin, LogDir: dir,
		Args:  []string{"api", "--api.listen", strings.TrimPrefix(apiURL, "http://")},
		Env:   []string{"POSTHORN_DATABASE__URL=" + faultkit.WithAppName(ledgerURL, e2eProcAPI), "POSTHORN_LOG__LEVEL=warn"},
		Ready: faultkit.HTTPReady(apiURL + "/readyz")})
	if err := api.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(api.Close)
	if _, err := demo.Load(ctx, demo.LoadConfig{BaseURL: apiURL, Postings: 500, Accounts: 1000, AccountPrefix: "acc-e2e-", KeyPrefix: "warm-alone-"}); err != nil {
		b.Fatal(err)
	}
	meter := &cpuMeter{procs: []*faultkit.Proc{api}, backends: []backendPart{
		{"the API's PostgreSQL backends", ledger, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, []any{e2eProcAPI}}}}
	before := meter.read(b)
	start := time.Now()
	res, err := flatOut(ctx, apiURL, "alone-", e2eWorkers, 20*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	split := meter.read(b).since(before, time.Since(start))
	var per []string
	for _, p := range split.parts {
		per = append(per, fmt.Sprintf("%s %.2f ms", p.name, p.secs*1000/res.postings))
	}
	return res.rate, strings.Join(per, ", ")
}

// flatOutProcesses runs the whole path as processes, flat out for a
// minute, prints its rates, lags and the machine's CPU split, and returns
// the path's rate in postings per second and whether the lags stayed
// flat.
func flatOutProcesses(b *testing.B, ctx context.Context, apiRate float64) (float64, bool) {
	b.Helper()
	ledgerURL, ledger := pgtest.Ledger(b)
	consumerURL, consumer := pgtest.Consumer(b)
	var ledgerDB, consumerDB string
	if err := ledger.QueryRow(ctx, `SELECT current_database()`).Scan(&ledgerDB); err != nil {
		b.Fatal(err)
	}
	if err := consumer.QueryRow(ctx, `SELECT current_database()`).Scan(&consumerDB); err != nil {
		b.Fatal(err)
	}
	bin, dir := posthornBin(b), b.TempDir()
	brokerAddr, apiAddr := freeAddr(b), freeAddr(b)
	apiURL := "http://" + apiAddr
	sinkEnv := []string{"POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=" + brokerAddr, "POSTHORN_LOG__LEVEL=warn"}
	broker := faultkit.NewProc(faultkit.ProcConfig{Name: "posthorn dev kafka", Bin: bin, LogDir: dir,
		Args:      []string{"dev", "kafka", "--listen", brokerAddr, "--partitions", fmt.Sprint(kfakebroker.DefaultPartitions)},
		ReadyLine: "kafka-protocol broker listening on"})
	api := faultkit.NewProc(faultkit.ProcConfig{Name: "posthorn api", Bin: bin, LogDir: dir,
		Args:  []string{"api", "--api.listen", apiAddr},
		Env:   []string{"POSTHORN_DATABASE__URL=" + faultkit.WithAppName(ledgerURL, e2eProcAPI), "POSTHORN_LOG__LEVEL=warn"},
		Ready: faultkit.HTTPReady(apiURL + "/readyz")})
	relay := faultkit.NewProc(faultkit.ProcConfig{Name: "posthorn relay", Bin: bin, LogDir: dir, Args: []string{"relay"},
		Env: append([]string{"POSTHORN_DATABASE__URL=" + ledgerURL, "POSTHORN_RELAY__OWNER=e2e"}, sinkEnv...)})
	consume := faultkit.NewProc(faultkit.ProcConfig{Name: "posthorn consume", Bin: bin, LogDir: dir, Args: []string{"consume"},
		Env: append([]string{"POSTHORN_CONSUMER__DATABASE__URL=" + consumerURL}, sinkEnv...)})
	procs := []*faultkit.Proc{broker, api, relay, consume}
	for _, p := range procs {
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
	}
	progress := func(b *testing.B, ctx context.Context) demo.Progress { return e2eProgress(b, ctx, ledger, consumer) }
	// Every consumer has joined its group before the measured load.
	if _, err := demo.Load(ctx, demo.LoadConfig{BaseURL: apiURL, Postings: 20, Accounts: 1000, AccountPrefix: "acc-warm-", KeyPrefix: "warm-"}); err != nil {
		b.Fatal(err)
	}
	waitCaughtUp(b, ctx, progress, 2*time.Minute)

	const window = time.Minute
	byApp := `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = $2`
	meter := &cpuMeter{procs: procs, backends: []backendPart{
		{"the API's PostgreSQL backends", ledger, byApp, []any{e2eProcAPI, ledgerDB}},
		// The relay names its sessions itself.
		{"the relay's PostgreSQL backends", ledger, byApp, []any{postgres.RelayApplicationName, ledgerDB}},
		{"the consumers' PostgreSQL backends", ledger, `SELECT pid FROM pg_stat_activity WHERE datname = $1`, []any{consumerDB}},
	}}
	loadCtx, stop := context.WithTimeout(ctx, window)
	defer stop()
	base := progress(b, ctx)
	samples := []demo.Progress{}
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-t.C:
				samples = append(samples, progress(b, ctx))
			}
		}
	}()
	before := meter.read(b)
	res, err := flatOut(loadCtx, apiURL, "max-", e2eWorkers, window)
	if err != nil {
		b.Fatal(err)
	}
	<-sampled
	split := meter.read(b).since(before, res.took)
	last := samples[len(samples)-1]
	mid := samples[len(samples)/2]
	events := last.Events - base.Events
	relayLag := func(s demo.Progress) int64 { return s.Unrelayed }
	consumerLag := func(s demo.Progress) int64 { return s.Lag() - s.Unrelayed } // behind the relay
	limit := "the Posting API (ledger writes): the relay and the consumers kept up"
	lagFlat := true
	switch {
	case relayLag(last) > 2*max(relayLag(mid), 1000):
		limit = "the relay: its backlog grew"
		lagFlat = false
	case consumerLag(last) > 2*max(consumerLag(mid), 1000):
		limit = "the consumers: their lag behind the relay grew"
		lagFlat = false
	}
	fmt.Printf("end to end as processes, highest steady rate over %s (%d API clients): %.0f postings/s, %.0f events/s (the API alone: %.0f postings/s, %.2f of it); lag at %s / at the end: relay %d / %d events, consumers %d / %d events; limited by %s; the machine's CPU over the window:%s\n",
		window, e2eWorkers, res.rate, float64(events)/res.took.Seconds(), apiRate, res.rate/apiRate, window/2,
		relayLag(mid), relayLag(last), consumerLag(mid), consumerLag(last), limit, split)
	return res.rate, lagFlat
}
