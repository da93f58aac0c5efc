package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
)

// Under load from several writers, with a backlog left before the first
// start and rolled-back transactions mixed in, every committed event is
// delivered exactly once, per account in revision order, and no event of a
// rolled-back transaction is.
func TestDeliversEveryCommittedEventInOrderUnderLoad(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	backlog := relaytest.MustPostTransfers(t, f.pool, 30, 7, 3)
	r := f.start("relay-a", nil)
	f.waitStreaming()
	w := startWriters(t, f.pool, 4, 25, 0)
	rolledBack := map[string]bool{}
	for i := range 20 {
		rolledBack[relaytest.MustRollBack(t, f.pool, fmt.Sprintf("acc-rb-%d", i))[0].EventID] = true
	}
	wait.For(t, 30*time.Second, "2,000 events under load", func() bool { return w.count() >= 2000 })
	posted := append(backlog, w.finish(t)...)
	got := f.waitAllDelivered(posted, 60*time.Second)
	for _, e := range got {
		if rolledBack[e.EventID] {
			t.Fatalf("event %s of a rolled-back transaction was delivered", e.EventID)
		}
	}
	if len(got) != len(posted) {
		t.Fatalf("delivered %d records for %d committed events (%d repeats)", len(got), len(posted), repeats(got))
	}
	relaytest.CheckOrder(t, got, false)
	if n := promtest.Value(t, r.reg, "posthorn_relay_published_total"); n != float64(len(posted)) {
		t.Errorf("posthorn_relay_published_total = %v, want %d", n, len(posted))
	}
	if n := promtest.Value(t, r.reg, "posthorn_cdc_catchup_events_total"); n != float64(len(backlog)) {
		t.Errorf("catch-up sent %v events, want the %d of the backlog before the first start", n, len(backlog))
	}
	if !strings.Contains(f.logs.String(), "first start in CDC mode") {
		t.Errorf("log does not say the slot was created on first start:\n%s", f.logs)
	}
	if n := promtest.Value(t, r.reg, "posthorn_cdc_slot_recoveries_total"); n != 0 {
		t.Errorf("first start counted as %v slot recoveries", n)
	}
}

// The shared server runs wal_level=replica: the relay refuses to start with
// an error that says what to change.
func TestCheckNamesWalLevel(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	r, err := cdc.New(relaystore.New(pool), cdcsource.New(pool), nil, relay.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Check(context.Background())
	if !errors.Is(err, cdc.ErrNotAvailable) || !strings.Contains(err.Error(), "wal_level") {
		t.Fatalf("Check on a wal_level=replica server: %v, want ErrCDCNotAvailable naming wal_level", err)
	}
}

// A role without REPLICATION is refused with the ALTER ROLE to run.
func TestCheckNamesReplicationAttribute(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	role := randName("norepl_")
	if _, err := f.pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", role, f.cluster.Port(), f.pool.Config().ConnConfig.Database)
	pool := pgtest.Pool(t, url, 2)
	r, err := cdc.New(relaystore.New(pool), cdcsource.New(pool), nil, relay.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Check(ctx)
	if !errors.Is(err, cdc.ErrNotAvailable) || !strings.Contains(err.Error(), "REPLICATION") {
		t.Fatalf("Check as a role without REPLICATION: %v, want ErrCDCNotAvailable naming REPLICATION", err)
	}
	// Control: the cluster's superuser passes.
	r, err = cdc.New(f.store, f.source, nil, relay.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(ctx); err != nil {
		t.Fatalf("Check as superuser on a logical cluster: %v", err)
	}
}

// Bad settings are refused naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   relay.Settings
		field string
	}{
		{relay.Settings{CDC: relay.CDC{Slot: "Bad-Slot"}}, "cdc.slot"},
		{relay.Settings{CDC: relay.CDC{Publication: "x;drop"}}, "cdc.publication"},
		{relay.Settings{BatchSize: -1}, "batch_size"},
		{relay.Settings{CDC: relay.CDC{StatusInterval: -time.Second}}, "cdc.status_interval"},
	} {
		_, err := cdc.New(nil, nil, nil, tc.cfg)
		if !errors.Is(err, relay.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %s", tc.cfg, err, tc.field)
		}
	}
}

// crashAt returns a hook that crashes on the n-th call with ACKed rows and
// records the event IDs of that batch.
func crashAt(n int, ids *[]string) func([]core.Envelope) error {
	calls := 0
	return func(batch []core.Envelope) error {
		calls++
		if calls < n {
			return nil
		}
		if calls == n {
			for _, e := range batch {
				*ids = append(*ids, e.EventID)
			}
		}
		return errors.New("crash")
	}
}

// crashOnceConfirmed is crashAt for a relay that confirms on receipt: at
// the crashing call it first waits (up to 2 s) for the slot's confirmed
// position on the server to move. The relay made that confirmation when it
// received the batch, and its reader sends it in the background; crashed
// at once, the relay could take it down unsent, and then lose nothing.
func (f *fixture) crashOnceConfirmed(n int, ids *[]string) func([]core.Envelope) error {
	crash := crashAt(n, ids)
	confirmed := func() string {
		return pgtest.Column[string](f.t, f.pool, `SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = $1`, f.slot)[0]
	}
	calls := 0
	return func(batch []core.Envelope) error {
		if calls++; calls == n {
			before := confirmed()
			wait.UntilEvery(2*time.Second, 20*time.Millisecond, func() (bool, string) { return confirmed() != before, "" })
		}
		return crash(batch)
	}
}

// A relay killed between the sink's ACK and the confirmation of the slot
// position (before the marker, and after it) loses nothing: a standby takes
// over when the lease expires and the crashed batch's events are sent again
// with the same IDs (before the marker) or found marked (after it).
func TestCrashBetweenAckAndConfirmRepeatsNothingLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		hook        func(*cdc.Hooks, func([]core.Envelope) error)
		wantRepeats bool
	}{
		{"before marker", func(h *cdc.Hooks, f func([]core.Envelope) error) { h.AfterAck = f }, true},
		{"after marker", func(h *cdc.Hooks, f func([]core.Envelope) error) { h.AfterMark = f }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, nil)
			var crashed []string
			hooks := &cdc.Hooks{}
			tc.hook(hooks, crashAt(3, &crashed))
			a := f.start("relay-a", nil, hooks)
			f.waitStreaming()
			b := f.start("relay-b", nil) // stands by: a holds the lease
			w := startWriters(t, f.pool, 3, 20, time.Millisecond)
			wait.For(t, 30*time.Second, "relay a to crash", a.Crashed)
			if promtest.Value(t, b.reg, "posthorn_cdc_reader") != 0 {
				t.Fatal("standby b was reading the slot while a held the lease")
			}
			posted, got := f.standbyTookOver(w, 1000, b)
			count := map[string]int{}
			for _, e := range got {
				count[e.EventID]++
			}
			repeated := 0
			for _, id := range crashed {
				if count[id] > 1 {
					repeated++
				}
			}
			if len(crashed) == 0 {
				t.Fatal("the crash hook saw no batch")
			}
			if tc.wantRepeats && repeated != len(crashed) {
				t.Errorf("%d of the %d events ACKed before the crash were sent again, want all (same IDs)", repeated, len(crashed))
			}
			t.Logf("crashed batch: %d events, repeated %d; %d records for %d events", len(crashed), repeated, len(got), len(posted))
		})
	}
}

// Negative control: a relay that confirms a transaction's position when it
// receives it (before the ACK), killed before publishing, loses events once
// nothing else covers them (no outbox catch-up on the next start).
func TestCrashNegativeControlConfirmOnReceiptLoses(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	var crashed []string
	a := f.start("relay-a", nil, &cdc.Hooks{UnsafeConfirmOnReceipt: true, BeforePublish: f.crashOnceConfirmed(3, &crashed)})
	f.waitStreaming()
	w := startWriters(t, f.pool, 3, 20, time.Millisecond)
	wait.For(t, 30*time.Second, "relay a to crash", a.Crashed)
	f.start("relay-b", nil, &cdc.Hooks{SkipCatchUp: true})
	wait.For(t, 30*time.Second, "1,000 events", func() bool { return w.count() >= 1000 })
	posted := w.finish(t)
	// Wait for b to deliver what it can: everything committed after the
	// crash (the last posted event is a proxy).
	lost := f.lostOnce(posted[len(posted)-1], "b to deliver the newest event", posted)
	if len(lost) == 0 {
		t.Fatal("negative control: confirming on receipt lost nothing; the crash test would not catch an early confirmation")
	}
	t.Logf("confirm on receipt + crash before publish: %d of %d events lost", len(lost), len(posted))
}
