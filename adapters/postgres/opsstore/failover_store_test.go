package opsstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
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

// A re-committed event stores only the headers the ledger's write path
// stores: what a record read back from a sink also carries (Watermill's
// message UUID, which the Kafka and Redis sinks refuse for good, a wire
// format's headers, the old history's ledger_timeline) is left out, and
// posthorn.failover_rebuild refuses it outright, naming the line, so no
// path can store a header the relay could not send. The maintainer may no
// longer call the unchecked posthorn.failover_recommit. Control: that
// function, which the previous recovery called, stores the header.
func TestFailoverStoreKeepsOnlyTheLedgersHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Ledger(t)
	m := roletest.As(t, url, postgres.RoleMaintainer)
	digest := core.IdempotencyDigest("k-1", [32]byte{1})
	j := lostJournal(t, "acc-a", "acc-b", 1, 1, 500)
	for i := range j.Lines {
		j.Lines[i].Headers = map[string]string{"_watermill_message_uuid": j.Lines[i].EventID, "ce_id": j.Lines[i].EventID,
			core.HeaderLedgerTimeline: "1", core.HeaderEventID: j.Lines[i].EventID, "meta_reference": "inv-1",
			"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", core.HeaderIdempotencyDigest: digest}
	}
	if _, err := opsstore.NewFailoverStore(m).Recover(ctx, ops.RecoveryPlan{Rebuild: []ops.RebuildJournal{j}}, "test"); err != nil {
		t.Fatal(err)
	}
	want := `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "meta_reference": "inv-1", "idempotency_digest": "` + digest + `"}`
	if got := pgtest.Column[string](t, owner, `SELECT headers::text FROM outbox ORDER BY id`); len(got) != 2 || got[0] != want || got[1] != want {
		t.Fatalf("re-committed rows store headers %v, want only the ledger's %s", got, want)
	}

	// lines is a lost journal's ID and lines, every line with headers h.
	lines := func(h map[string]string) (string, string) {
		l := lostJournal(t, "acc-c", "acc-d", 1, 1, 5)
		for i := range l.Lines {
			l.Lines[i].Headers = h
		}
		doc, err := json.Marshal(l.Lines)
		if err != nil {
			t.Fatal(err)
		}
		return l.JournalID, string(doc)
	}
	journals := pgtest.Column[int64](t, owner, `SELECT count(*) FROM journals`)[0]
	for h, field := range map[string]string{"_watermill_message_uuid": "lines[0].headers: key '_watermill_message_uuid'",
		core.HeaderLedgerTimeline: "lines[0].headers: key 'ledger_timeline' is a contract header"} {
		id, doc := lines(map[string]string{h: "x"})
		_, err := m.Exec(ctx, `SELECT posthorn.failover_rebuild($1::uuid, now(), $2::jsonb)`, id, doc)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("failover_rebuild with header %s: %v, want a refusal naming %q", h, err, field)
		}
	}
	if n := pgtest.Column[int64](t, owner, `SELECT count(*) FROM journals`)[0]; n != journals {
		t.Fatalf("refused rebuilds wrote %d journals", n-journals)
	}
	// Control: the unchecked function, which the maintainer may not call,
	// stores what a transport added when the owner calls it.
	id, doc := lines(map[string]string{"_watermill_message_uuid": "x"})
	roletest.AssertRefused(t, owner, m, []roletest.Refusal{
		{What: "re-commit without the header check", SQL: `SELECT posthorn.failover_recommit('` + id + `', now(), '` + doc + `')`},
	})
	if _, err := owner.Exec(ctx, `SELECT posthorn.failover_recommit($1::uuid, now(), $2::jsonb)`, id, doc); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Column[int64](t, owner, `SELECT count(*) FROM outbox WHERE headers ? '_watermill_message_uuid'`)[0]; n != 2 {
		t.Fatalf("control: the unchecked re-commit stored the transport's header on %d rows, want 2", n)
	}
}

// A retry of a key the recovery recorded writes nothing: restored, it
// answers the re-committed journal (replayed); lost, it is refused with
// the journal's ID (core.IdempotencyKeyLostError); past the key's lifetime
// it is a new posting, as any expired key. The Posting API's role reads
// the table and may not write it. Control: the same retry with no record
// posts the money a second time.
func TestFailoverKeysAnswerAClientsRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Ledger(t)
	m := roletest.As(t, url, postgres.RoleMaintainer)
	apiPool := roletest.As(t, url, postgres.RoleAPI)
	store := ledgerstore.New(apiPool, ledgerstore.Config{})
	posting := func(amount int64) core.Posting {
		return core.Posting{Entries: []core.Entry{{Account: "acc-a", Direction: core.Debit, Amount: amount, Currency: "EUR"},
			{Account: "acc-b", Direction: core.Credit, Amount: amount, Currency: "EUR"}}}
	}
	restored := lostJournal(t, "acc-a", "acc-b", 1, 1, 500)
	lostID := uuid.Must(uuid.NewV7()).String()
	digest := func(key string, amount int64) string {
		return core.IdempotencyDigest(key, core.PostingHash(posting(amount)))
	}
	plan := ops.RecoveryPlan{Rebuild: []ops.RebuildJournal{restored}, Keys: []ops.LostKey{
		{Digest: digest("k-restored", 500), JournalID: restored.JournalID, Restored: true, PostedAt: restored.PostedAt},
		{Digest: digest("k-lost", 7), JournalID: lostID, Reason: "journal does not balance", PostedAt: time.Now()},
		{Digest: digest("k-expired", 9), JournalID: lostID, Reason: "old", PostedAt: time.Now().Add(-800 * time.Hour)},
	}}
	res, err := opsstore.NewFailoverStore(m).Recover(ctx, plan, "test")
	if err != nil || res.KeysRestored != 1 || res.KeysLost != 2 {
		t.Fatalf("recover: %+v, %v; want 1 key restored and 2 lost", res, err)
	}
	journals := func() int64 { return pgtest.Column[int64](t, owner, `SELECT count(*) FROM journals`)[0] }
	before := journals()

	got, replayed, err := store.Post(ctx, "k-restored", posting(500))
	if err != nil || !replayed || got.JournalID != restored.JournalID || len(got.Events) != 2 || got.Events[0].EventID != restored.Lines[0].EventID {
		t.Fatalf("retry of a restored key: %+v, replayed %v, %v; want the re-committed journal %s", got, replayed, err, restored.JournalID)
	}
	_, _, err = store.Post(ctx, "k-lost", posting(7))
	lost, ok := errors.AsType[*core.IdempotencyKeyLostError](err)
	if !ok || lost.JournalID != lostID || !strings.Contains(lost.Reason, "does not balance") {
		t.Fatalf("retry of a lost key: %v, want the lost journal %s named", err, lostID)
	}
	if n := journals(); n != before {
		t.Fatalf("the retries wrote %d journals", n-before)
	}
	if _, replayed, err := store.Post(ctx, "k-expired", posting(9)); err != nil || replayed {
		t.Fatalf("a retry past the key's lifetime: replayed %v, %v; want a new posting", replayed, err)
	}
	// Control: a key the recovery did not record posts again.
	if _, replayed, err := store.Post(ctx, "k-unrecorded", posting(11)); err != nil || replayed || journals() != before+2 {
		t.Fatalf("control: replayed %v, %v, %d journals", replayed, err, journals()-before)
	}
	roletest.AssertRefused(t, owner, apiPool, []roletest.Refusal{
		{What: "forget a lost key", SQL: `DELETE FROM posthorn.failover_keys`},
		{What: "restore a key by hand", SQL: `SELECT posthorn.failover_record_key('` + strings.Repeat("a", 43) + `', gen_random_uuid(), true, '', now())`},
	})
}

// balanceChainFaults lists each journal line whose balance_after is not its
// account's opening balance plus every delta up to it, and each balance
// that is not the sum of its lines.
const balanceChainFaults = `
SELECT 'line ' || l.account_id || ' revision ' || l.revision || ': ' || coalesce(l.balance_after::text, 'none') || ', want ' || l.want
FROM (SELECT jl.account_id, jl.revision, jl.balance_after,
             o.balance + sum(CASE WHEN jl.direction = 'credit' THEN jl.amount ELSE -jl.amount END)
                 OVER (PARTITION BY jl.account_id, jl.currency ORDER BY jl.revision) AS want
      FROM journal_lines AS jl JOIN account_opening_balances AS o ON o.account_id = jl.account_id AND o.currency = jl.currency) AS l
WHERE l.balance_after IS DISTINCT FROM l.want
UNION ALL
SELECT 'balance ' || b.account_id || ': ' || b.balance || ', want ' || s.sum
FROM account_balances AS b JOIN (SELECT account_id, currency, sum(CASE WHEN direction = 'credit' THEN amount ELSE -amount END)
                                 FROM journal_lines GROUP BY 1, 2) AS s ON s.account_id = b.account_id AND s.currency = b.currency
WHERE b.balance <> s.sum`

// A recovery re-commits lost postings in the order it is given, which may
// put an account's later lost posting in first: the earlier one's lines
// then carry the balance before them, and the later one's the balance
// after both, as does the next posting of the API. Control: the same
// recovery with failover_recommit computing only its own lines' balances
// leaves the later line's balance short of the earlier posting.
func TestFailoverRecommitKeepsEveryBalanceInOrder(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		ctx := context.Background()
		_, owner := pgtest.Ledger(t)
		if control {
			var def string
			if err := owner.QueryRow(ctx, `SELECT pg_get_functiondef('posthorn.failover_recommit(uuid, timestamptz, jsonb)'::regprocedure)`).Scan(&def); err != nil {
				t.Fatal(err)
			}
			own := strings.Replace(def, "AND jl.revision >= m.from_revision) AS r", "AND jl.revision >= m.from_revision AND jl.journal_id = failover_recommit.journal_id) AS r", 1)
			if own == def {
				t.Fatal("control: failover_recommit's recomputation not found")
			}
			if _, err := owner.Exec(ctx, own); err != nil {
				t.Fatal(err)
			}
		}
		api := ledgerstore.New(owner, ledgerstore.Config{})
		if _, _, err := api.Post(ctx, "k-1", core.Posting{Entries: []core.Entry{
			{Account: "acc-a", Direction: core.Debit, Amount: 100, Currency: "EUR"},
			{Account: "acc-b", Direction: core.Credit, Amount: 100, Currency: "EUR"}}}); err != nil {
			t.Fatal(err)
		}
		earlier, later := lostJournal(t, "acc-a", "acc-b", 2, 2, 20), lostJournal(t, "acc-a", "acc-b", 3, 3, 3)
		if _, err := opsstore.NewFailoverStore(owner).Recover(ctx, ops.RecoveryPlan{Rebuild: []ops.RebuildJournal{later, earlier}}, "test"); err != nil {
			t.Fatalf("recover: %v", err)
		}
		if _, _, err := api.Post(ctx, "k-2", core.Posting{Entries: []core.Entry{
			{Account: "acc-b", Direction: core.Debit, Amount: 1, Currency: "EUR"},
			{Account: "acc-a", Direction: core.Credit, Amount: 1, Currency: "EUR"}}}); err != nil {
			t.Fatal(err)
		}
		faults := pgtest.Column[string](t, owner, balanceChainFaults)
		balances := pgtest.Column[string](t, owner, `SELECT account_id || ' ' || balance FROM account_balances ORDER BY 1`)
		t.Logf("control %v: balances %v, faults %v", control, balances, faults)
		switch {
		case !control && (len(faults) != 0 || strings.Join(balances, ", ") != "acc-a -122, acc-b 122"):
			t.Errorf("after an out-of-order recovery: balances %v, faults %v; want acc-a -122, acc-b 122 and none", balances, faults)
		case control && len(faults) == 0:
			t.Errorf("control: each re-commit computing its own lines left every balance whole (%v): the order did not bite", balances)
		}
	}
}

// An inbox is read a page at a time: every event of the consumer once, in
// event ID order, no page above ops.SeenBatch; another consumer's events
// and rows without an aggregate are left out; an error of the reader stops
// the read and comes back unchanged.
func TestInboxSeenPagesThroughEveryEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	want := 2*ops.SeenBatch + 7
	if _, err := pool.Exec(ctx, `
INSERT INTO consumer_inbox (consumer, event_id, aggregate_type, aggregate_id, revision, disposition, headers)
SELECT c, gen_random_uuid()::text, 'account', CASE WHEN i = 0 THEN '' ELSE 'acc-' || (i % 50) END, i, 'applied',
       CASE WHEN i = 1 THEN jsonb_build_object($3::text, 'j-1') END
FROM unnest(ARRAY['c', 'other']) AS c, generate_series(0, $1::int) AS i
WHERE c = 'c' OR i < $2`, want, 5, core.HeaderJournalID); err != nil {
		t.Fatal(err)
	}
	src := opsstore.InboxSeen{Pool: pool, Consumer: "c"}
	var ids []string
	pages, journals := 0, 0
	err := src.Seen(ctx, func(page []ops.SeenEvent) error {
		pages++
		if len(page) > ops.SeenBatch {
			t.Fatalf("a page of %d events, want at most %d", len(page), ops.SeenBatch)
		}
		for _, e := range page {
			ids = append(ids, e.EventID)
			if e.JournalID != "" {
				journals++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != want || !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != want || journals != 1 || pages != 3 {
		t.Fatalf("read %d events in %d pages (sorted %v, %d with a journal); want %d once each in 3 pages, one with its journal",
			len(ids), pages, slices.IsSorted(ids), journals, want)
	}
	stop := errors.New("the ledger is gone")
	calls := 0
	err = src.Seen(ctx, func([]ops.SeenEvent) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Fatalf("reader's error: read returned %v after %d pages, want it unchanged after 1", err, calls)
	}
}

// After cleanup removed a posting's outbox rows, an inbox's copy of its
// event (which names no journal) is still held by the line at its account
// and revision, and a service's event by its aggregate's revision floor;
// a copy at a revision no line or floor reaches, one whose revision a live
// outbox row of another event holds (reissued), and one a recovery
// recorded as lost are not. The control: the outbox no longer has the
// cleaned events' IDs, so without those rules every copy of them would be
// named lost.
func TestFailoverInspectAfterCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, owner := roletest.Ledger(t)
	store := opsstore.NewFailoverStore(roletest.As(t, url, postgres.RoleMaintainer))
	cleaned := lostJournal(t, "acc-a", "acc-b", 1, 1, 500)
	live := lostJournal(t, "acc-c", "acc-d", 1, 1, 5)
	recorded := ops.LostEvent{SeenEvent: ops.SeenEvent{EventID: uuid.Must(uuid.NewV7()).String(), AggregateType: core.AggregateAccount,
		AggregateID: "acc-b", Revision: 1, SeenBy: []string{"inbox"}}, Reason: "recorded by an earlier recovery"}
	if _, err := store.Recover(ctx, ops.RecoveryPlan{Rebuild: []ops.RebuildJournal{cleaned, live}, Record: []ops.LostEvent{recorded}}, "test"); err != nil {
		t.Fatal(err)
	}
	var orders []string // revisions 1, 2 and 3
	for range 3 {
		orders = append(orders, pgtest.Column[string](t, owner, `SELECT event_id::text FROM posthorn_publish('orders', 'o-1', 'order.placed', '{}')`)...)
	}
	removed := []string{cleaned.Lines[0].EventID, cleaned.Lines[1].EventID, orders[0], orders[1]}
	if _, err := owner.Exec(ctx, `DELETE FROM outbox WHERE event_id = ANY($1::uuid[])`, removed); err != nil {
		t.Fatal(err)
	}
	copyOf := func(id, account string, rev int64, journal string) ops.SeenEvent {
		return ops.SeenEvent{EventID: id, AggregateType: core.AggregateAccount, AggregateID: account, Revision: rev, JournalID: journal}
	}
	other := uuid.Must(uuid.NewV7()).String()
	cases := []struct {
		name string
		e    ops.SeenEvent
		held bool
	}{
		{"cleaned, no journal named", copyOf(cleaned.Lines[0].EventID, "acc-a", 1, ""), true},
		{"cleaned, its journal named", copyOf(cleaned.Lines[1].EventID, "acc-b", 1, cleaned.JournalID), true},
		{"no line at its revision", copyOf(other, "acc-a", 2, ""), false},
		{"its revision reissued, outbox row live", copyOf(uuid.Must(uuid.NewV7()).String(), "acc-c", 1, ""), false},
		{"recorded lost, its revision's row cleaned", copyOf(recorded.EventID, "acc-b", 1, ""), false},
		{"a service's, cleaned", ops.SeenEvent{EventID: orders[1], AggregateType: "orders", AggregateID: "o-1", Revision: 2}, true},
		{"a service's, its revision's row live", ops.SeenEvent{EventID: other, AggregateType: "orders", AggregateID: "o-1", Revision: 3}, false},
		{"a service's, past its floor", ops.SeenEvent{EventID: uuid.Must(uuid.NewV7()).String(), AggregateType: "orders", AggregateID: "o-1", Revision: 4}, false},
	}
	var seen []ops.SeenEvent
	for _, c := range cases {
		seen = append(seen, c.e)
	}
	states, err := store.Inspect(ctx, seen)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if st := states[c.e.EventID]; st.Held != c.held {
			t.Errorf("%s: held %v (%+v), want %v", c.name, st.Held, st, c.held)
		}
	}
	if n := pgtest.Column[int64](t, owner, `SELECT count(*) FROM outbox WHERE event_id = ANY($1::uuid[])`, removed)[0]; n != 0 {
		t.Fatalf("control: the outbox still has %d of the cleaned events", n)
	}
}

// The failover check's lookup is not compiled by the server's JIT
// whatever its plan costs: a plan for a batch of thousands of events on a
// ledger of millions of rows is priced past every jit_*_above_cost, and
// compiling it took half a second a batch where the lookups took 30 ms.
// The costs are set to 0 here, as a 10M-event ledger's plan crosses them.
// The control: the lookup without its settings is compiled.
func TestFailoverInspectIsNotCompiledByTheJIT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Ledger(t)
	if !pgtest.Column[bool](t, pool, `SELECT pg_jit_available()`)[0] {
		t.Skip("this server has no JIT provider (llvmjit): there is nothing to compile")
	}
	id := uuid.Must(uuid.NewV7()).String()
	for _, c := range []struct {
		name, settings string
		wantJIT        bool
	}{
		{"failover check's lookup", opsstore.InspectSettingsForTest, false},
		{"control: the same lookup without its settings", `SELECT 1`, true},
	} {
		var plan string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL jit_above_cost = 0; SET LOCAL jit_inline_above_cost = 0; SET LOCAL jit_optimize_above_cost = 0`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, c.settings); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+opsstore.InspectEventsForTest,
				[]string{id}, []string{core.AggregateAccount}, []string{"acc-a"}, []int64{1}, []string{""}).Scan(&plan)
		})
		if err != nil {
			t.Fatal(err)
		}
		if jit := strings.Contains(plan, `"JIT"`); jit != c.wantJIT {
			t.Errorf("%s: compiled by the JIT = %v, want %v; plan: %s", c.name, jit, c.wantJIT, plan)
		}
	}
}

// The audit log is read from its consumer's mark through the consumer's
// inbox rows changed since, so the mark may be used only while retention
// has deleted no inbox row changed at or after it. A row pruned from
// before the mark leaves the mark in use; once retention deletes one
// changed after it, the mark is refused and the source read whole. The
// control: read from the mark all the same, the audit log's row of the
// pruned event is missing, which a whole read gives.
func TestSeenMarkIsRefusedOnceRetentionDeletedARowChangedAfterIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	in := inboxstore.New(pool)
	const consumer = "audit-log"
	src := opsstore.AuditLogSeen{Pool: pool, Consumer: consumer}
	// applied writes an applied event as the audit log's consumer does;
	// changed is its inbox row's changed_xid ("" for its transaction's).
	applied := func(revision int64, changed string) string {
		t.Helper()
		id := uuid.Must(uuid.NewV7()).String()
		if _, err := pool.Exec(ctx, `
WITH i AS (INSERT INTO consumer_inbox (consumer, event_id, aggregate_type, aggregate_id, revision, disposition, changed_xid)
           VALUES ($1, $2, 'account', 'acc-a', $3, 'applied', coalesce(nullif($4, '')::xid8, pg_current_xact_id())))
INSERT INTO audit_log (event_id, type, aggregate_type, aggregate_id, revision, payload)
VALUES ($2, 'ledger.account.credited', 'account', 'acc-a', $3, '{}')`, consumer, id, revision, changed); err != nil {
			t.Fatal(err)
		}
		return id
	}
	position := func(revision int64) {
		t.Helper()
		if _, err := pool.Exec(ctx, `
INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id, last_revision) VALUES ($1, 'account', 'acc-a', $2)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET last_revision = EXCLUDED.last_revision`, consumer, revision); err != nil {
			t.Fatal(err)
		}
	}
	prune := func() int64 {
		t.Helper()
		later := time.Now().Add(time.Hour)
		res, err := in.PruneInbox(ctx, consumer, ops.InboxHorizon{Ordered: later, Unordered: later}, 100)
		if err != nil {
			t.Fatal(err)
		}
		return res.Deleted
	}

	// The mark is the oldest transaction running on the server, which
	// other tests may hold back: the row from before it is given a
	// transaction ID below any mark.
	before := applied(1, "3")
	p, err := in.BeginPass(ctx, consumer, "h")
	if err != nil {
		t.Fatal(err)
	}
	if err := in.RecordMark(ctx, consumer, p.Next, "h", uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	pruned, last := applied(2, ""), applied(3, "")

	position(2)
	if n := prune(); n != 1 {
		t.Fatalf("retention deleted %d rows, want the one from before the mark", n)
	}
	m, err := src.SeenMark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Since != p.Next || m.Witness == "" {
		t.Fatalf("after a prune from before the mark: mark %d (%q), want %d with its witness", m.Since, m.Why, p.Next)
	}
	if got := seenSince(t, src, m.Since); !slices.Equal(got, sortedIDs(pruned, last)) {
		t.Fatalf("read from the mark: %v, want the two events after it", got)
	}

	position(3)
	if n := prune(); n != 1 {
		t.Fatalf("retention deleted %d rows, want the one changed after the mark", n)
	}
	if m, err := src.SeenMark(ctx); err != nil || m.Since != 0 || !strings.Contains(m.Why, "retention") {
		t.Fatalf("after a prune from after the mark: mark %d (%q, %v), want none for retention's delete", m.Since, m.Why, err)
	}
	// Control: from the mark regardless, the pruned event's audit row is
	// not read; whole, it is.
	if got := seenSince(t, src, p.Next); slices.Contains(got, pruned) {
		t.Fatalf("control: read from the mark after the prune: %v, want %s missing", got, pruned)
	}
	var whole []string
	if err := src.Seen(ctx, func(page []ops.SeenEvent) error {
		for _, e := range page {
			whole = append(whole, e.EventID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(whole, sortedIDs(before, pruned, last)) {
		t.Fatalf("read whole: %v, want every audit log row", whole)
	}
}

// seenSince is what src reads from since, by event ID.
func seenSince(t *testing.T, src ops.MarkedSource, since uint64) []string {
	t.Helper()
	var ids []string
	if err := src.SeenSince(context.Background(), since, func(page []ops.SeenEvent) error {
		for _, e := range page {
			ids = append(ids, e.EventID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

func sortedIDs(ids ...string) []string { return slices.Sorted(slices.Values(ids)) }

// The failover check reads the marks as the reconciler's role may; a login
// that may not read them (a consumer's own) gets the mark refused with the
// reason, and the source is read whole rather than the check failing.
func TestSeenMarkAsARoleThatMayNotReadTheMarks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := roletest.Consumer(t)
	reconciler := roletest.As(t, url, postgres.RoleReconciler)
	in := inboxstore.New(reconciler)
	p, err := in.BeginPass(ctx, "audit-log", "h")
	if err != nil {
		t.Fatal(err)
	}
	if err := in.RecordMark(ctx, "audit-log", p.Next, "h", uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	if m, err := (opsstore.InboxSeen{Pool: reconciler, Consumer: "audit-log"}).SeenMark(ctx); err != nil || m.Since != p.Next {
		t.Fatalf("as the reconciler: mark %d (%q, %v), want %d", m.Since, m.Why, err, p.Next)
	}
	consumer, err := postgres.Connect(ctx, roletest.Consumers(t, url, "pw", "audit-log"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consumer.Close)
	m, err := (opsstore.InboxSeen{Pool: consumer, Consumer: "audit-log"}).SeenMark(ctx)
	if err != nil || m.Since != 0 || !strings.Contains(m.Why, "could not be read") {
		t.Fatalf("as the consumer: mark %d (%q, %v), want none, for want of the privilege", m.Since, m.Why, err)
	}
	t.Logf("as the consumer: %s", m.Why)
}
