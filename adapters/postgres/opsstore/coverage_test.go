package opsstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

// A journal whose transaction took its sequence before a later journal
// committed, but has not committed itself, makes the cut unprovable: a
// snapshot taken now would miss it although its sequence is below the
// cut. OpenCut waits for it, refuses after the settle time, and once it
// commits the cut contains it.
func TestOpenCutWaitsForInFlightSequence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	store := ledgerstore.New(pool, ledgerstore.Config{})
	opsStore := opsstore.New(pool)
	post := func(key string) core.PostingResult {
		t.Helper()
		res, _, err := store.Post(ctx, key, core.Posting{Entries: []core.Entry{
			{Account: "acc-a-" + key, Direction: core.Debit, Amount: 5, Currency: "EUR"},
			{Account: "acc-b-" + key, Direction: core.Credit, Amount: 5, Currency: "EUR"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	post("first")

	// The slow transaction takes its sequence and stays open.
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = slow.Rollback(ctx) }()
	slowID := uuid.Must(uuid.NewV7())
	var slowSeq int64
	if err := slow.QueryRow(ctx, `INSERT INTO journals (id, sequence, posted_at) VALUES ($1, nextval('journal_sequence'), now()) RETURNING sequence`,
		slowID.String()).Scan(&slowSeq); err != nil {
		t.Fatal(err)
	}
	later := post("later")
	if later.Sequence <= slowSeq {
		t.Fatalf("later sequence %d not above the slow one %d", later.Sequence, slowSeq)
	}

	// Negative control: a plain snapshot now has the later journal but
	// not the slow one, whose sequence is below it.
	if n := journalsAtOrBelow(t, pool, later.Sequence); n != 2 {
		t.Fatalf("plain snapshot sees %d journals, want 2 (the slow one missing): the fault this test is about did not occur", n)
	}

	_, err = opsStore.OpenCut(ctx, ops.CutRequest{Settle: 200 * time.Millisecond})
	if !errors.Is(err, ops.ErrCutNotProvable) {
		t.Fatalf("cut with a transaction in flight: %v, want ErrCutNotProvable", err)
	}

	// The slow one commits concurrently (before or during the wait, the
	// answer must be the same): the cut includes it.
	committed := make(chan error, 1)
	go func() { committed <- slow.Commit(ctx) }()
	cut, err := opsStore.OpenCut(ctx, ops.CutRequest{Settle: 30 * time.Second})
	if cerr := <-committed; cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	if cut.Sequence != later.Sequence {
		t.Fatalf("cut %d, want %d", cut.Sequence, later.Sequence)
	}
	if n := journalsAtOrBelow(t, pool, cut.Sequence); n != 3 {
		t.Fatalf("after the wait %d journals at or below the cut, want 3", n)
	}
}

func journalsAtOrBelow(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, seq int64) int {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var n int
	if err := tx.QueryRow(context.Background(), `SELECT count(*) FROM journals WHERE sequence <= $1`, seq).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
