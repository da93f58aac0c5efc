package ledgerstore_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// BenchmarkLedgerWrite measures ledger transactions per second with 8
// concurrent writers on the same write path (Store.Post) in these
// outbox modes, side by side in one run:
//
//	journal         (a) the journal alone, no outbox rows
//	ours            (b) journal + our outbox (OutboxSchema) and the relay's
//	                coalesced wake-up NOTIFY after commit, as deployed
//	stock           (c) journal + Watermill's stock DefaultPostgreSQLSchema
//	ours-untimed    (d) ours without the ledger_timeline column's default
//	                (the outbox as before rows recorded their timeline), so
//	                that default's cost is ours over this
//
// Modes (a) and (c) exist for this measurement only, here: the store
// writes through another schema adapter (NewWithSchemaForBench);
// (a)'s adapter, journalOnly, inserts nothing.
//
// Each mode has its own fresh database (pool of 16, so 8 writers never
// queue) and is warmed up (every one of the 1,000 accounts created, every
// statement prepared). The timed part then alternates the modes in chunks
// of POSTHORN_BENCH_CHUNK postings (default 400), POSTHORN_BENCH_CHUNKS
// times (default 12), rotating which mode goes first: on a shared machine
// the load drifts over seconds, and fine interleaving makes every mode see
// the same drift. A mode's rate is its postings over its summed time.
//
// The workload is fixed and b.N ignored, so `-benchtime 1x` (make bench)
// yields the figures in one pass of about 30 s.
func BenchmarkLedgerWrite(b *testing.B) {
	chunk := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNK", 400)
	chunks := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNKS", 12)
	const writers = 8
	modes := []*benchMode{
		{name: "journal", schema: journalOnly{}},
		{name: "ours", schema: ledgerstore.OutboxSchema{}},
		{name: "stock", schema: wsql.DefaultPostgreSQLSchema{}},
		{name: "ours-untimed", schema: ledgerstore.OutboxSchema{}, prepare: `ALTER TABLE outbox ALTER COLUMN ledger_timeline DROP DEFAULT`},
	}
	for _, m := range modes {
		m.setup(b, writers)
	}
	b.ResetTimer()
	for c := 0; c < chunks; c++ {
		for i := range modes {
			m := modes[(c+i)%len(modes)]
			m.elapsed += m.run(b, "bench-"+strconv.Itoa(c)+"-", chunk, writers, randomTransfer)
		}
	}
	b.StopTimer()
	rate := make(map[string]float64)
	for _, m := range modes {
		rate[m.name] = float64(chunk*chunks) / m.elapsed.Seconds()
		b.ReportMetric(rate[m.name], m.name+"_tx/s")
	}
	b.ReportMetric(0, "ns/op") // the workload is fixed; ns/op means nothing here
	ours, stock := rate["ours"]/rate["journal"], rate["stock"]/rate["journal"]
	b.ReportMetric(ours, "ours/journal")
	b.ReportMetric(stock, "stock/journal")
	b.Logf("%d postings per mode, 8 writers: journal %.0f tx/s, ours %.0f, stock %.0f",
		chunk*chunks, rate["journal"], rate["ours"], rate["stock"])
	b.Logf("ledger write overhead vs journal alone: ours %.1f%% (ratio %.3f), stock %.1f%% (ratio %.3f)", (1-ours)*100, ours, (1-stock)*100, stock)
	b.ReportMetric(rate["ours"]/rate["ours-untimed"], "ours/untimed")
	b.Logf("the outbox rows' ledger_timeline default: ours %.0f tx/s, without it %.0f (ratio %.3f)",
		rate["ours"], rate["ours-untimed"], rate["ours"]/rate["ours-untimed"])
}

// journalOnly is the outbox schema of the journal-alone baseline: its
// insert writes no row (a statement that selects nothing, queued on the
// posting's batch like the real insert, so no round trip is added).
type journalOnly struct{ ledgerstore.OutboxSchema }

func (journalOnly) InsertQuery(wsql.InsertQueryParams) (wsql.Query, error) {
	return wsql.Query{Query: "SELECT 1 WHERE false"}, nil
}

type benchMode struct {
	name   string
	schema wsql.SchemaAdapter
	// prepare is run on the mode's fresh database before the warm-up.
	prepare string
	url     string
	pool    *pgxpool.Pool
	store   *ledgerstore.Store
	elapsed time.Duration
}

const benchAccounts = 1000

func benchAccount(i int) string { return "acc-" + strconv.Itoa(i) }

func randomTransfer(r *rand.Rand) core.Posting {
	from := r.IntN(benchAccounts)
	to := (from + 1 + r.IntN(benchAccounts-1)) % benchAccounts
	return transfer(benchAccount(from), benchAccount(to), 1+r.Int64N(10000), "EUR")
}

func (m *benchMode) setup(b *testing.B, writers int) {
	b.Helper()
	m.url, m.pool = pgtest.Ledger(b)
	ctx := context.Background()
	if _, stock := m.schema.(wsql.DefaultPostgreSQLSchema); stock {
		// The stock publisher may not create its table inside a
		// transaction: create it here, as a migration would.
		qs, err := wsql.DefaultPostgreSQLSchema{}.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: core.TopicEvents})
		if err != nil {
			b.Fatal(err)
		}
		for _, q := range qs {
			if _, err := m.pool.Exec(ctx, q.Query, q.Args...); err != nil {
				b.Fatal(err)
			}
		}
	}
	if m.prepare != "" {
		if _, err := m.pool.Exec(ctx, m.prepare); err != nil {
			b.Fatal(err)
		}
	}
	m.store = ledgerstore.NewWithSchemaForBench(m.pool, m.schema)
	// Warm-up: create every account (pairs 2i, 2i+1) and prepare every
	// statement on every writer's connection.
	var n atomic.Int64
	m.run(b, "warm-", benchAccounts/2, writers, func(*rand.Rand) core.Posting {
		i := int(n.Add(1)) - 1
		return transfer(benchAccount(2*i), benchAccount(2*i+1), 1, "EUR")
	})
}

// run posts n postings with writers goroutines and returns the wall time.
func (m *benchMode) run(b *testing.B, keyPrefix string, n, writers int, next func(*rand.Rand) core.Posting) time.Duration {
	ctx := context.Background()
	var claimed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(len(keyPrefix))))
			for {
				i := claimed.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if _, _, err := m.store.Post(ctx, keyPrefix+strconv.FormatInt(i, 10), next(r)); err != nil {
					b.Errorf("%s: %v", m.name, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	if b.Failed() {
		b.FailNow()
	}
	return elapsed
}
