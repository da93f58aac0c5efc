package cdc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
)

// bigTransaction commits one transaction of accounts × perAccount outbox
// rows and returns their event IDs.
func bigTransaction(t *testing.T, f *fixture, accounts, perAccount int) []string {
	t.Helper()
	ctx := context.Background()
	if err := relaytest.Fill(ctx, f.pool, "big", accounts, perAccount); err != nil {
		t.Fatal(err)
	}
	rows, err := f.pool.Query(ctx, `SELECT event_id::text FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != accounts*perAccount {
		t.Fatalf("outbox holds %d rows, want %d", len(ids), accounts*perAccount)
	}
	return ids
}

// A transaction larger than a batch is delivered while it streams (its
// first batch is published before the rest has arrived), and a relay
// killed after marking part of it, before the transaction's end, loses
// nothing: the position is confirmed only past the end, so the standby
// streams the transaction again and finds the delivered part marked.
// Negative control: a relay that confirms the transaction's position when
// its end arrives, killed before the last batch is published, loses that
// batch once nothing else covers it (no outbox catch-up on the next start).
func TestLargeTransactionIsDeliveredWhileItStreams(t *testing.T) {
	t.Parallel()
	// 2,100 rows: four full batches while the transaction streams, the
	// last 100 after its end has arrived.
	const accounts, perAccount, batch = 50, 42, 500
	t.Run("crash mid-transaction", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, nil)
		var (
			mu    sync.Mutex
			sizes []int
		)
		a := f.start("relay-a", func(c *relay.Settings) { c.BatchSize = batch }, &cdc.Hooks{AfterMark: func(b []core.Envelope) error {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(b))
			if len(sizes) == 2 {
				return errCrashHook
			}
			return nil
		}})
		f.waitStreaming()
		ids := bigTransaction(t, f, accounts, perAccount)
		wait.For(t, 30*time.Second, "relay a to crash", a.Crashed)
		// Started only now, so it cannot take a slow relay's lease before
		// the crash; it takes over once the crashed relay's lease expires.
		b := f.start("relay-b", nil)
		mu.Lock()
		first := sizes[0]
		mu.Unlock()
		if first > batch {
			t.Fatalf("the first delivery held %d rows of the %d-row transaction: it waited for the transaction's end instead of delivering batches of %d while it streamed", first, len(ids), batch)
		}
		f.waitAllDelivered(postedIDs(ids), 60*time.Second)
		// The standby catches up from the outbox, then streams the
		// transaction again (its position was not confirmed) and finds
		// every row of it marked.
		wait.For(t, 30*time.Second, "the standby to stream the transaction again", func() bool {
			return promtest.Value(t, b.reg, "posthorn_cdc_skipped_marked_total") >= float64(len(ids))
		})
		got := f.delivered()
		relaytest.CheckOrder(t, got, true)
		if r := repeats(got); r != 0 {
			t.Errorf("%d events sent twice; the delivered part should have been found marked", r)
		}
		t.Logf("deliveries before the crash: %v rows; %d records for %d events", sizes, len(got), len(ids))
	})
	t.Run("control: confirm on receipt", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, nil)
		var (
			mu        sync.Mutex
			published int
		)
		a := f.start("relay-a", func(c *relay.Settings) { c.BatchSize = batch }, &cdc.Hooks{UnsafeConfirmOnReceipt: true, BeforePublish: func(b []core.Envelope) error {
			mu.Lock()
			defer mu.Unlock()
			if published+len(b) >= accounts*perAccount {
				return errCrashHook // the last batch, after the end arrived
			}
			published += len(b)
			return nil
		}})
		f.waitStreaming()
		ids := bigTransaction(t, f, accounts, perAccount)
		wait.For(t, 30*time.Second, "relay a to crash", a.Crashed)
		f.start("relay-b", nil, &cdc.Hooks{SkipCatchUp: true})
		f.waitStreaming(2)
		newest := relaytest.MustPost(t, f.pool, "acc-newest")
		lost := f.lostOnce(newest[0], "b to deliver an event committed after the crash", postedIDs(ids))
		if len(lost) == 0 {
			t.Fatal("negative control: confirming the transaction on receipt lost nothing; the crash test would not catch it")
		}
		t.Logf("confirm on receipt + crash before the last batch: %d of %d events lost", len(lost), len(ids))
	})
}

// A sink outage longer than the server's wal_sender_timeout, while the
// stream holds more than the reader reads ahead (so it waits for the
// relay), does not end the replication stream: the reader keeps answering
// the WAL sender while the relay retries. Negative control: a reader that
// stays silent while it waits for the relay has its stream ended by the
// server.
func TestSinkOutageOutlastsWALSenderTimeout(t *testing.T) {
	t.Parallel()
	c := pgtest.LogicalCluster(t, pgcluster.Options{ExtraConf: map[string]string{"wal_sender_timeout": "1s"}})
	for _, silent := range []bool{false, true} {
		name := "reader answers"
		if silent {
			name = "control: silent reader"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, c)
			f.start("relay-a", nil, &cdc.Hooks{UnsafeSilentReader: silent})
			f.waitStreaming()
			f.sink.SetDown(true)
			ids := bigTransaction(t, f, 100, 120) // 12,000 rows: more than the reader reads ahead
			time.Sleep(4 * time.Second)           // the outage: four times the server's timeout
			f.sink.SetDown(false)
			f.waitAllDelivered(postedIDs(ids), 60*time.Second)
			ended := strings.Contains(f.logs.String(), "CDC stream ended")
			switch {
			case !silent && ended:
				t.Fatalf("the stream ended during the outage although the reader answers:\n%s", f.logs)
			case silent && !ended:
				t.Fatal("negative control: a silent reader kept its stream through the outage; the test would not catch a reader that stops answering")
			}
		})
	}
}

var errCrashHook = errors.New("crash")

func postedIDs(ids []string) []relaytest.Posted {
	out := make([]relaytest.Posted, len(ids))
	for i, id := range ids {
		out[i] = relaytest.Posted{EventID: id}
	}
	return out
}
