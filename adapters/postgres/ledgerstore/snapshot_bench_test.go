package ledgerstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// BenchmarkLedgerWriteUnderASnapshot measures the write path (8 writers,
// Store.Post, transfers between 1,000 accounts) with and without a
// REPEATABLE READ snapshot held open for the whole run, and the table
// settings of the rows every posting updates again (an account's revision,
// its balance) as the migrations set them (fillfactor 50) against
// PostgreSQL's defaults. Per mode: postings/s, the
// share of those updates that were HOT (no new index entry), and the pages
// of the two tables and their primary keys at the end. Modes alternate in
// chunks as in BenchmarkLedgerWrite.
func BenchmarkLedgerWriteUnderASnapshot(b *testing.B) {
	chunk := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNK", 400)
	chunks := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNKS", 12)
	const writers = 8
	defaults := `ALTER TABLE accounts RESET (fillfactor); ALTER TABLE account_balances RESET (fillfactor)`
	type snapMode struct {
		*benchMode
		snapshot bool
		held     pgx.Tx
	}
	var modes []*snapMode
	for _, snapshot := range []bool{false, true} {
		for _, prepare := range []string{"", defaults} {
			name := "migrations"
			if prepare != "" {
				name = "defaults"
			}
			if snapshot {
				name += "+snapshot"
			}
			m := &snapMode{benchMode: &benchMode{name: name, schema: ledgerstore.OutboxSchema{}, prepare: prepare}, snapshot: snapshot}
			m.setup(b, writers)
			modes = append(modes, m)
		}
	}
	ctx := context.Background()
	for _, m := range modes {
		if !m.snapshot {
			continue
		}
		m.held = holdSnapshot(b, m.pool)
	}
	b.ResetTimer()
	for c := 0; c < chunks; c++ {
		for i := range modes {
			m := modes[(c+i)%len(modes)]
			m.elapsed += m.run(b, "snap-"+strconv.Itoa(c)+"-", chunk, writers, randomTransfer)
		}
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
	for _, m := range modes {
		if m.held != nil {
			_ = m.held.Rollback(ctx)
		}
		// Each backend sends its table statistics when it ends.
		m.pool.Close()
		rate := float64(chunk*chunks) / m.elapsed.Seconds()
		b.ReportMetric(rate, m.name+"_tx/s")
		fmt.Printf("BenchmarkLedgerWriteUnderASnapshot: %-20s %6.0f postings/s  %s\n", m.name, rate, updateStats(b, m.url, chunk*chunks))
	}
}

// updateStats reports, once every backend's statistics arrived (want
// updates of account_balances), the HOT share of the updates of accounts and
// account_balances and the pages of each and of its primary key.
func updateStats(tb testing.TB, url string, want int) string {
	out := ""
	for _, u := range tableUpdates(tb, url, want) {
		out += fmt.Sprintf("  %s: %d updates, %.1f%% HOT, %d pages, pkey %d", u.table, u.updates, 100*u.hotShare(), u.pages, u.pkPages)
	}
	return out
}

// tableUpdate is what the statistics say of the updates of one table.
type tableUpdate struct {
	table                        string
	updates, hot, pages, pkPages int64
}

func (u tableUpdate) hotShare() float64 { return float64(u.hot) / float64(max(u.updates, 1)) }

// tableUpdates reads the updates of accounts and account_balances from
// the statistics, waiting up to 15 s for want updates of account_balances
// to arrive (a backend sends its statistics when it ends, or idle, within
// seconds). A posting updates no account (it locks them): accounts' count
// stays at what failover recoveries and tests moved.
func tableUpdates(tb testing.TB, url string, want int) []tableUpdate {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	var out []tableUpdate
	for _, table := range []string{"accounts", "account_balances"} {
		u := tableUpdate{table: table}
		deadline := time.Now().Add(15 * time.Second)
		for {
			if err := conn.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, pg_relation_size(relid) / 8192, pg_relation_size($1::regclass) / 8192
FROM pg_stat_user_tables WHERE relname = $2`, table+"_pkey", table).Scan(&u.updates, &u.hot, &u.pages, &u.pkPages); err != nil {
				tb.Fatal(err)
			}
			if table != "account_balances" || u.updates >= int64(want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		out = append(out, u)
	}
	return out
}

// BenchmarkPostingHotAccountsUnderASnapshot measures the write path on a
// few hot accounts while a REPEATABLE READ snapshot is held for the whole
// run: 4 writers post transfers among 4 accounts, in chunks of
// POSTHORN_BENCH_POSTINGS (default 2,000), POSTHORN_BENCH_CHUNKS times
// (default 8), and it prints the rate per chunk. Every version of a row a
// posting updates stays behind the snapshot, and the next posting of the
// account walks them: a cost that grows shows as a falling rate.
func BenchmarkPostingHotAccountsUnderASnapshot(b *testing.B) {
	perChunk := pgtest.EnvInt(b, "POSTHORN_BENCH_POSTINGS", 2000)
	chunks := pgtest.EnvInt(b, "POSTHORN_BENCH_CHUNKS", 8)
	const writers, hot = 4, 4
	m := &benchMode{name: "hot", schema: ledgerstore.OutboxSchema{}}
	m.setup(b, writers)
	holdSnapshot(b, m.pool)
	hotTransfer := func(r *rand.Rand) core.Posting {
		from := r.IntN(hot)
		return transfer(benchAccount(from), benchAccount((from+1+r.IntN(hot-1))%hot), 1+r.Int64N(10000), "EUR")
	}
	b.ResetTimer()
	var rates []float64
	for c := range chunks {
		d := m.run(b, "hot-"+strconv.Itoa(c)+"-", perChunk, writers, hotTransfer)
		rates = append(rates, float64(perChunk)/d.Seconds())
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
	line := ""
	for _, r := range rates {
		line += fmt.Sprintf(" %.0f", r)
	}
	fmt.Printf("BenchmarkPostingHotAccountsUnderASnapshot: postings/s per chunk of %d:%s (last/first %.2f)\n", perChunk, line, rates[len(rates)-1]/rates[0])
	b.ReportMetric(rates[0], "first_postings/s")
	b.ReportMetric(rates[len(rates)-1], "last_postings/s")
}
