package cdc_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
)

// rebuildLines is a lost posting of 5 from debit to credit at revision 1
// of each, as posthorn failover recover hands it to the ledger's function:
// the events' IDs and the lines' JSON.
func rebuildLines(t *testing.T, journal, debit, credit string) ([]string, string) {
	t.Helper()
	type line struct {
		EventID  string            `json:"event_id"`
		Account  string            `json:"account"`
		Revision int64             `json:"revision"`
		Currency string            `json:"currency"`
		Delta    string            `json:"delta"`
		Payload  json.RawMessage   `json:"payload"`
		Headers  map[string]string `json:"headers"`
	}
	var ids []string
	var lines []line
	for _, l := range []struct{ account, delta string }{{debit, "-5"}, {credit, "5"}} {
		id := uuid.Must(uuid.NewV7()).String()
		p, err := json.Marshal(core.AccountPosted{EventID: id, JournalID: journal, Account: l.account, Revision: 1, Currency: "EUR",
			Delta: l.delta, PostedAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		lines = append(lines, line{EventID: id, Account: l.account, Revision: 1, Currency: "EUR", Delta: l.delta, Payload: p,
			Headers: map[string]string{"meta_reference": "inv-1"}})
	}
	doc, err := json.Marshal(lines)
	if err != nil {
		t.Fatal(err)
	}
	return ids, string(doc)
}

// A failover recovery re-commits lost postings with their outbox rows
// already marked relayed: the world has those events. The CDC relay sees
// their inserts in its stream; the transaction carries the message
// posthorn.relayed (posthorn.failover_rebuild), so the relay checks those
// rows' markers and sends none of them, parks nothing, and delivers the
// accounts' later events. Control: the same rows written by the function
// without the message (posthorn.failover_recommit, what the previous
// recovery called) go out again as new records.
func TestCDCRelaySkipsRowsARecoveryInsertedAsRelayed(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"failover_rebuild", "failover_recommit"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newFixture(t, nil)
			r := f.start("relayed", nil)
			f.waitStreaming()
			journal := uuid.Must(uuid.NewV7()).String()
			ids, doc := rebuildLines(t, journal, "acc-r1", "acc-r2")
			if _, err := f.pool.Exec(ctx, `SELECT posthorn.`+fn+`($1::uuid, now(), $2::jsonb)`, journal, doc); err != nil {
				t.Fatal(err)
			}
			later := relaytest.MustPost(t, f.pool, "acc-r1", "acc-r2")
			f.waitAllDelivered(later, 30*time.Second)
			sent := 0
			for _, e := range f.delivered() {
				if e.EventID == ids[0] || e.EventID == ids[1] {
					sent++
				}
			}
			parked := promtest.Value(t, r.reg, "posthorn_relay_parked_aggregates")
			skipped := promtest.Value(t, r.reg, "posthorn_cdc_skipped_marked_total")
			t.Logf("%s: %d of the 2 re-committed events sent again, %v skipped as marked, %v aggregates parked, later revisions delivered",
				fn, sent, skipped, parked)
			if parked != 0 {
				t.Fatalf("%v aggregates parked", parked)
			}
			if fn == "failover_rebuild" && (sent != 0 || skipped < 2) {
				t.Fatalf("the relay sent %d re-committed events again (skipped %v): they were inserted as relayed", sent, skipped)
			}
			if fn == "failover_recommit" && sent != 2 {
				t.Fatalf("control: without the message %d of the 2 re-committed events were sent again, want 2", sent)
			}
		})
	}
}
