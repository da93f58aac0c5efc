package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/fsarchive"
	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

// BenchmarkOps measures the operator's passes over one ledger of 6,000
// postings (12,000 events) with both example consumers' inboxes filled:
// reconcile, replay from the outbox, archive, cleanup, replay from the
// archive. Designed for -benchtime 1x; each figure is printed.
func BenchmarkOps(b *testing.B) {
	const postings, writers = 6000, 8
	ctx := context.Background()
	_, ledger := pgtest.Ledger(b)
	_, consumer := pgtest.Consumer(b)
	store := ledgerstore.New(ledger, ledgerstore.Config{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := w; i < postings; i += writers {
				_, _, err := store.Post(ctx, fmt.Sprintf("bench-%d", i), core.Posting{Entries: []core.Entry{
					{Account: fmt.Sprintf("acc-%d", i%200), Direction: core.Debit, Amount: 7, Currency: "EUR"},
					{Account: fmt.Sprintf("acc-%d", (i+1)%200), Direction: core.Credit, Amount: 7, Currency: "EUR"},
				}})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// The relay's and the consumers' work is not measured here: mark every
	// row relayed and give each event an applied inbox row per consumer.
	if _, err := ledger.Exec(ctx, `DELETE FROM outbox_pending`); err != nil {
		b.Fatal(err)
	}
	opsStore := opsstore.New(ledger)
	rows, err := opsStore.ReadRows(ctx, ops.RowFilter{EventsOnly: true}, 1_000_000)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []string{projection.Name, auditlog.Name} {
		if _, err := consumer.CopyFrom(ctx, pgx.Identifier{"consumer_inbox"},
			[]string{"consumer", "event_id", "kind", "type", "aggregate_type", "aggregate_id", "revision", "disposition"},
			pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
				e := rows[i].Envelope
				return []any{c, e.EventID, string(e.Kind), e.Type, e.AggregateType, e.AggregateID, e.Revision, "applied"}, nil
			})); err != nil {
			b.Fatal(err)
		}
	}
	in := inboxstore.New(consumer)
	sources := []ops.ConsumerSource{
		{Name: projection.Name, Reader: ops.InboxReader{Inbox: in, Consumer: projection.Name}},
		{Name: auditlog.Name, Reader: ops.InboxReader{Inbox: in, Consumer: auditlog.Name}},
	}
	events := float64(len(rows))
	figure := func(what, unit string, n float64, d time.Duration) {
		b.ReportMetric(n/d.Seconds(), unit+"-rows/s")
		fmt.Printf("BenchmarkOps: %-28s %7.0f rows in %6.2fs = %8.0f rows/s\n", what, n, d.Seconds(), n/d.Seconds())
	}
	// The passes change the data (cleanup deletes it), so one round is the
	// measurement whatever b.N is.
	b.ResetTimer()
	{
		start := time.Now()
		rep, err := ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: opsStore, Consumers: sources, Record: true})
		if err != nil || !rep.Clean {
			b.Fatalf("reconcile: %v %+v", err, rep)
		}
		figure("reconcile (2 consumers)", "reconcile", events, time.Since(start))

		sink := memory.New(memory.Config{})
		start = time.Now()
		res, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: opsStore, Sink: sink, Batch: 1000})
		if err != nil || res.Sent != int64(len(rows)) {
			b.Fatalf("replay: %v %+v", err, res)
		}
		figure("replay from the outbox", "replay-outbox", events, time.Since(start))

		archive, err := fsarchive.Open(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		ares, err := ops.Archive(ctx, ops.ArchiveConfig{Ledger: opsStore, Archive: archive, Required: []string{projection.Name, auditlog.Name}})
		if err != nil {
			b.Fatal(err)
		}
		figure("archive (fsync per segment)", "archive", float64(ares.Rows), time.Since(start))

		start = time.Now()
		cres, err := ops.Cleanup(ctx, ops.CleanupConfig{Ledger: opsStore, Archive: archive, Required: []string{projection.Name, auditlog.Name}, BatchSize: 1000})
		if err != nil {
			b.Fatal(err)
		}
		figure("cleanup (1,000 rows per tx)", "cleanup", float64(cres.Deleted), time.Since(start))

		start = time.Now()
		res, err = ops.Replay(ctx, ops.ReplayConfig{Ledger: opsStore, Archive: archive, Sink: sink, Batch: 1000})
		if err != nil || res.FromArchive != int64(len(rows)) {
			b.Fatalf("replay from the archive: %v %+v", err, res)
		}
		figure("replay from the archive", "replay-archive", events, time.Since(start))
		_ = sink.Close()
		b.StopTimer()
	}
}
