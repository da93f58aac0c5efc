package ledgerstore_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

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
