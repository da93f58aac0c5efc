package relaystore_test

import (
	"context"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
)

// TestSecurityDeadLetterOnlyThroughItsFunction: the relay's role, which
// `posthorn outbox dead-letter` runs as, dead-letters a parked record
// through posthorn.dead_letter, and cannot do what the function does by
// hand: rewrite an outbox row or write dead_letters (lifting a park is its
// own duty, release). The function runs as posthorn_definer with what it
// needs: a grant it lacked (a lock on the park) failed it for the relay's
// role while the superuser's tests passed.
func TestSecurityDeadLetterOnlyThroughItsFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, owner := roletest.Ledger(t)
	res, _, err := ledgerstore.New(owner, ledgerstore.Config{}).Post(ctx, "dl-key", core.Posting{Entries: []core.Entry{
		{Account: "acc-dl", Direction: core.Debit, Amount: 10, Currency: "EUR"},
		{Account: "acc-other", Direction: core.Credit, Amount: 10, Currency: "EUR"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var eventID string
	for _, e := range res.Events {
		if e.Account == "acc-dl" {
			eventID = e.EventID
		}
	}
	if _, err := relaystore.New(owner).Park(ctx, core.ParkedAggregate{AggregateType: core.AggregateAccount,
		AggregateID: "acc-dl", EventID: eventID, Reason: "too large for the sink", ParkedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	relay := roletest.As(t, u, postgres.RoleRelay)
	for _, stmt := range []string{
		`UPDATE outbox SET type = 'posthorn.dead_lettered', payload = '' WHERE event_id = '` + eventID + `'`,
		`INSERT INTO dead_letters (event_id, outbox_id, kind, type, topic, aggregate_type, aggregate_id, revision, headers, payload, reason, operator)
		 SELECT event_id, id, kind, type, topic, aggregate_type, aggregate_id, revision, headers, payload, 'by hand', 'mallory' FROM outbox WHERE event_id = '` + eventID + `'`,
	} {
		if _, err := relay.Exec(ctx, stmt); !roletest.Denied(err) {
			t.Errorf("as %s: %.60q… was not refused: %v", postgres.RoleRelay, stmt, err)
		}
	}
	var deadID string
	if err := relay.QueryRow(ctx, `SELECT dead_event_id::text FROM posthorn.dead_letter('account', 'acc-dl', NULL, 'alice', NULL, false)`).Scan(&deadID); err != nil {
		t.Fatalf("as %s, posthorn.dead_letter: %v", postgres.RoleRelay, err)
	}
	var typ string
	var parked, dead int
	if err := owner.QueryRow(ctx, `SELECT (SELECT type FROM outbox WHERE event_id = $1::uuid),
	    (SELECT count(*) FROM relay_parked WHERE aggregate_id = 'acc-dl'), (SELECT count(*) FROM dead_letters WHERE event_id = $1::uuid)`,
		deadID).Scan(&typ, &parked, &dead); err != nil {
		t.Fatal(err)
	}
	if deadID != eventID || typ != core.TypeDeadLettered || parked != 0 || dead != 1 {
		t.Fatalf("after posthorn.dead_letter: event %s (want %s), its row's type %q, %d parks, %d dead letters", deadID, eventID, typ, parked, dead)
	}
}
