package opsstore_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/ops"
)

// lostJournal is a posting as its published events carry it: one debit of
// from and one credit of to, at the given revisions.
func lostJournal(t *testing.T, from, to string, fromRev, toRev, amount int64) ops.RebuildJournal {
	t.Helper()
	j := ops.RebuildJournal{JournalID: uuid.Must(uuid.NewV7()).String(), PostedAt: time.Now().UTC().Truncate(time.Microsecond)}
	for _, l := range []struct {
		account string
		rev     int64
		delta   int64
	}{{from, fromRev, -amount}, {to, toRev, amount}} {
		id := uuid.Must(uuid.NewV7()).String()
		payload, err := json.Marshal(core.AccountPosted{EventID: id, JournalID: j.JournalID, Account: l.account, Revision: l.rev,
			Currency: "EUR", Delta: strconv.FormatInt(l.delta, 10), PostedAt: j.PostedAt})
		if err != nil {
			t.Fatal(err)
		}
		j.Lines = append(j.Lines, ops.RebuildLine{EventID: id, Account: l.account, Revision: l.rev, Currency: "EUR", Delta: l.delta, Payload: payload})
	}
	return j
}

// The maintainer recovers through the functions alone: a lost posting is
// re-committed with its IDs and revisions and its events marked relayed,
// the sequences move, the history is accepted; a posting that does not
// balance, or whose revision another posting holds, is refused naming the
// field, with nothing written. The maintainer cannot write the ledger's
// tables or move a sequence itself, and the relay may not run a recovery
// (the owner's run of the same statements is the control).
func TestFailoverStoreRecoversAsTheMaintainerOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Ledger(t)
	m := roletest.As(t, url, postgres.RoleMaintainer)
	store := opsstore.NewFailoverStore(m)

	j := lostJournal(t, "acc-a", "acc-b", 1, 1, 500)
	res, err := store.Recover(ctx, ops.RecoveryPlan{Rebuild: []ops.RebuildJournal{j}, OutboxIDPast: 100, JournalSequencePast: 200,
		Moves: []ops.AggregateMove{{AggregateType: "account", AggregateID: "acc-c", Seen: 7}, {AggregateType: "orders", AggregateID: "o-1", Seen: 3}}},
		"test")
	if err != nil {
		t.Fatalf("recover as posthorn_maintainer: %v", err)
	}
	if len(res.Rebuilt) != 1 || res.SequencesMoved != 2 || res.AggregatesMoved != 2 || !res.HistoryAccepted {
		t.Fatalf("recovery result %+v", res)
	}
	got, err := ledgerstore.New(owner, ledgerstore.Config{}).Posting(ctx, j.JournalID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != 2 || got.Entries[0].EventID != j.Lines[0].EventID || got.Entries[0].Direction != core.Debit ||
		got.Entries[1].EventID != j.Lines[1].EventID || got.Entries[1].Amount != "500" || got.Sequence <= 200 {
		t.Fatalf("re-committed posting %+v", got)
	}
	if n := relaytest.Unrelayed(t, owner); n != 0 {
		t.Fatalf("%d re-committed events pending: the relay would send them as new", n)
	}
	if revs := pgtest.Column[int64](t, owner, `SELECT revision FROM accounts WHERE id = 'acc-c'
UNION ALL SELECT revision FROM posthorn_aggregates WHERE aggregate_type = 'orders'`); len(revs) != 2 || revs[0] != 7 || revs[1] != 3 {
		t.Fatalf("revisions moved to %v, want 7 and 3", revs)
	}
	if outboxID, seq, err := store.Sequences(ctx); err != nil || outboxID < 100 || seq <= 200 {
		t.Fatalf("sequences %d, %d (%v): want past 100 and 200", outboxID, seq, err)
	}
	// Again: nothing changes.
	if again, err := store.Recover(ctx, ops.RecoveryPlan{Rebuild: []ops.RebuildJournal{j}, OutboxIDPast: 100, JournalSequencePast: 200}, "test"); err != nil ||
		len(again.Rebuilt) != 0 || again.SequencesMoved != 0 {
		t.Fatalf("second recovery: %+v, %v", again, err)
	}

	journals := pgtest.Column[int64](t, owner, `SELECT count(*) FROM journals`)[0]
	unbalanced := lostJournal(t, "acc-a", "acc-b", 2, 2, 5)
	unbalanced.Lines = unbalanced.Lines[:1]
	reissued := lostJournal(t, "acc-b", "acc-a", 1, 2, 5) // acc-b revision 1 is j's
	for _, c := range []struct {
		what  string
		j     ops.RebuildJournal
		field string
	}{{"unbalanced", unbalanced, "lines: journal"}, {"reissued", reissued, "held by other postings"}} {
		_, err := store.Recover(ctx, ops.RecoveryPlan{Rebuild: []ops.RebuildJournal{c.j}}, "test")
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s journal: %v, want a refusal naming %q", c.what, err, c.field)
		}
	}
	if n := pgtest.Column[int64](t, owner, `SELECT count(*) FROM journals`)[0]; n != journals {
		t.Fatalf("refused recoveries wrote %d journals", n-journals)
	}

	roletest.AssertRefused(t, owner, m, []roletest.Refusal{
		{What: "insert a journal", SQL: `INSERT INTO journals (id, sequence, posted_at) VALUES (gen_random_uuid(), 999999, now())`},
		{What: "move an account's revision", SQL: `UPDATE accounts SET revision = revision + 1`},
		{What: "move the journal sequence", SQL: `SELECT setval('journal_sequence', 1)`},
		{What: "accept a history by hand", SQL: `INSERT INTO posthorn.ledger_timelines (system_identifier, timeline, accepted_by) VALUES (1, 99, 'x')`},
	})
	roletest.AssertRefused(t, owner, roletest.As(t, url, postgres.RoleRelay), []roletest.Refusal{
		{What: "accept the history", SQL: `SELECT posthorn.failover_accept('relay')`},
		{What: "move the sequences", SQL: `SELECT posthorn.failover_advance(0, 0, '{}', '{}', '{}')`},
	})
}
