package auditlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

func TestHandleStoresEventsAndRefusesNonJSONForGood(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Consumer(t)
	ctx := context.Background()
	e := core.Envelope{EventID: "e1", Kind: core.KindEvent, Type: core.TypeAccountPosted, AggregateType: core.AggregateAccount,
		AggregateID: "acc", Revision: 1, JournalID: "j1", OccurredAt: time.Now(), Replay: true, Payload: []byte(`{"delta":"5"}`)}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return auditlog.Handle(ctx, tx, e) }); err != nil {
		t.Fatal(err)
	}
	var replay bool
	var delta string
	if err := pool.QueryRow(ctx, `SELECT replay, payload->>'delta' FROM audit_log WHERE event_id = 'e1'`).Scan(&replay, &delta); err != nil {
		t.Fatal(err)
	}
	if !replay || delta != "5" {
		t.Fatalf("stored replay=%v delta=%q", replay, delta)
	}
	e.EventID, e.Payload = "e2", []byte("not json")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return auditlog.Handle(ctx, tx, e) })
	if !core.IsPermanent(err) {
		t.Fatalf("non-JSON payload: %v, want a permanent error (parked as poison)", err)
	}
}
