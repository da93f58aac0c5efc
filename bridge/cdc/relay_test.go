package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/pgtest"
	"github.com/posthorn/posthorn/bridge/bridgetest"
	"github.com/posthorn/posthorn/bridge/cdc"
)

// Under load from several writers, with a backlog left before the first
// start and rolled-back transactions mixed in, every committed event is
// delivered exactly once, per account in revision order, and no event of a
// rolled-back transaction is.
func TestDeliversEveryCommittedEventInOrderUnderLoad(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	var backlog []bridgetest.Posted
	for i := range 30 {
		backlog = append(backlog, bridgetest.MustPost(t, f.pool, fmt.Sprintf("acc-%d", i%7), fmt.Sprintf("acc-%d", (i+3)%7))...)
	}
	r := f.start("relay-a", nil)
	f.waitStreaming()
	w := startWriters(t, f.pool, 4, 25, 0)
	rolledBack := map[string]bool{}
	for i := range 20 {
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := bridgetest.Post(ctx, tx, fmt.Sprintf("acc-rb-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		rolledBack[ps[0].EventID] = true
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	bridgetest.WaitFor(t, 30*time.Second, "2,000 events under load", func() bool { return w.count() >= 2000 })
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
	checkOrder(t, got, false)
	if n := metric(t, r.reg, "posthorn_relay_published_total"); n != float64(len(posted)) {
		t.Errorf("posthorn_relay_published_total = %v, want %d", n, len(posted))
	}
	if n := metric(t, r.reg, "posthorn_cdc_catchup_events_total"); n != float64(len(backlog)) {
		t.Errorf("catch-up sent %v events, want the %d of the backlog before the first start", n, len(backlog))
	}
	if !strings.Contains(f.logs.String(), "first start in CDC mode") {
		t.Errorf("log does not say the slot was created on first start:\n%s", f.logs)
	}
	if n := metric(t, r.reg, "posthorn_cdc_slot_recoveries_total"); n != 0 {
		t.Errorf("first start counted as %v slot recoveries", n)
	}
}

// The shared server runs wal_level=replica: the relay refuses to start with
// an error that says what to change.
func TestCheckNamesWalLevel(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	r, err := cdc.New(postgres.NewRelayStore(pool), nil, cdc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Check(context.Background())
	if !errors.Is(err, postgres.ErrCDCNotAvailable) || !strings.Contains(err.Error(), "wal_level") {
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
	pool, err := postgres.Connect(ctx, url, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := cdc.New(postgres.NewRelayStore(pool), nil, cdc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Check(ctx)
	if !errors.Is(err, postgres.ErrCDCNotAvailable) || !strings.Contains(err.Error(), "REPLICATION") {
		t.Fatalf("Check as a role without REPLICATION: %v, want ErrCDCNotAvailable naming REPLICATION", err)
	}
	// Control: the cluster's superuser passes.
	r, err = cdc.New(f.store, nil, cdc.Config{})
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
		cfg   cdc.Config
		field string
	}{
		{cdc.Config{Slot: "Bad-Slot"}, "Slot"},
		{cdc.Config{Publication: "x;drop"}, "Publication"},
		{cdc.Config{BatchSize: -1}, "BatchSize"},
		{cdc.Config{StatusInterval: -time.Second}, "StatusInterval"},
	} {
		_, err := cdc.New(nil, nil, tc.cfg)
		if !errors.Is(err, cdc.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %s", tc.cfg, err, tc.field)
		}
	}
}
