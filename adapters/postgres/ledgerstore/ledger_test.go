package ledgerstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

func transfer(from, to string, amount int64, currency string) core.Posting {
	return core.Posting{Entries: []core.Entry{
		{Account: from, Direction: core.Debit, Amount: amount, Currency: currency},
		{Account: to, Direction: core.Credit, Amount: amount, Currency: currency},
	}}
}

func TestPostWritesJournalLinesRevisionsAndOutboxTogether(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	store := ledgerstore.New(pool, ledgerstore.Config{CommandTopicPrefix: "cmd."})
	p := transfer("acc-alice", "acc-bob", 1250, "EUR")
	p.Metadata = map[string]string{"reference": "inv-1"}
	p.Commands = []core.CommandSpec{
		{Type: "payouts.payout.execute", Payload: json.RawMessage(`{"beneficiary":"acc-bob"}`)},
		{Type: "notify.email.send", Payload: json.RawMessage(`{}`)},
	}
	res, replayed, err := store.Post(ctx, "key-1", p)
	if err != nil || replayed {
		t.Fatalf("Post: replayed=%v err=%v", replayed, err)
	}
	if res.Sequence != 1 || len(res.Events) != 2 || len(res.Commands) != 2 {
		t.Fatalf("result %+v", res)
	}

	// The outbox rows carry the contract's columns.
	rows, err := pool.Query(ctx, `SELECT event_id::text, kind, type, topic, aggregate_type, aggregate_id, revision, shard,
		journal_id::text, headers::text, payload FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type outboxRow struct {
		eventID, kind, typ, topic, aggType, aggID string
		revision                                  int64
		shard                                     int
		journalID, headers                        string
		payload                                   []byte
	}
	var got []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.eventID, &r.kind, &r.typ, &r.topic, &r.aggType, &r.aggID, &r.revision, &r.shard, &r.journalID, &r.headers, &r.payload); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("outbox has %d rows, want 2 events + 2 commands", len(got))
	}
	// Each event carries the key's digest (so a failover that loses the
	// posting keeps what its key answers); metadata only by allow-list.
	digest := fmt.Sprintf(`{"idempotency_digest": %q}`, core.IdempotencyDigest("key-1", core.PostingHash(p)))
	for i, acc := range []string{"acc-alice", "acc-bob"} {
		r := got[i]
		want := outboxRow{res.Events[i].EventID, "event", core.TypeAccountPosted, core.TopicEvents, core.AggregateAccount, acc, 1, core.ShardOf(acc), res.JournalID, digest, nil}
		r.payload = nil
		if fmt.Sprint(r) != fmt.Sprint(want) {
			t.Errorf("event row %d = %+v, want %+v", i, r, want)
		}
		var ap core.AccountPosted
		if err := json.Unmarshal(got[i].payload, &ap); err != nil {
			t.Fatal(err)
		}
		wantDelta := []string{"-1250", "1250"}[i]
		if ap.EventID != want.eventID || ap.JournalID != res.JournalID || ap.Account != acc || ap.Revision != 1 || ap.Currency != "EUR" || ap.Delta != wantDelta || !ap.PostedAt.Equal(res.PostedAt) {
			t.Errorf("payload %d = %+v, want delta %s", i, ap, wantDelta)
		}
	}
	for i, c := range []struct{ typ, topic string }{{"payouts.payout.execute", "cmd.payouts"}, {"notify.email.send", "cmd.notify"}} {
		r := got[2+i]
		if r.kind != "command" || r.typ != c.typ || r.topic != c.topic || r.aggType != core.AggregateJournal || r.aggID != res.JournalID ||
			r.revision != int64(i+1) || r.eventID != res.Commands[i].EventID || r.shard != core.ShardOf(res.JournalID) {
			t.Errorf("command row %d = %+v", i, r)
		}
	}

	// Reading it back shows the posting as committed.
	cp, err := store.Posting(ctx, res.JournalID)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Sequence != 1 || len(cp.Entries) != 2 || cp.Entries[0].Amount != "1250" || cp.Entries[0].Direction != core.Debit ||
		cp.Entries[1].EventID != res.Events[1].EventID || cp.Metadata["reference"] != "inv-1" || len(cp.Commands) != 2 ||
		string(cp.Commands[0].Payload) != `{"beneficiary":"acc-bob"}` {
		t.Errorf("Posting() = %+v", cp)
	}
	for acc, want := range map[string]int64{"acc-alice": -1250, "acc-bob": 1250} {
		a, err := store.Account(ctx, acc)
		if err != nil || a.Revision != 1 || a.Balances["EUR"] != want {
			t.Errorf("Account(%s) = %+v, %v; want revision 1, EUR %d", acc, a, err, want)
		}
	}
	if _, err := store.Account(ctx, "nobody"); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Account(nobody) err = %v, want ErrNotFound", err)
	}
	if _, err := store.Posting(ctx, "01900000-0000-7000-8000-000000000000"); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Posting(unknown) err = %v, want ErrNotFound", err)
	}
}

// An outbox insert that fails must take the whole posting with it: no
// journal, no lines, no revision bump, no balance change, no key. The
// negative control removes the fault and the same request commits.
func TestPostIsAtomicWhenOutboxInsertFails(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	store := ledgerstore.New(pool, ledgerstore.Config{})
	if _, _, err := store.Post(ctx, "before", transfer("a", "b", 10, "EUR")); err != nil {
		t.Fatal(err)
	}
	before := pgtest.LedgerState(t, pool)
	_, err := pool.Exec(ctx, `CREATE FUNCTION fail_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'outbox insert refused by test'; END $$;
CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION fail_outbox();`)
	if err != nil {
		t.Fatal(err)
	}
	p := transfer("a", "c", 5, "EUR") // an existing and a new account
	if _, _, err := store.Post(ctx, "during", p); err == nil {
		t.Fatal("Post succeeded although the outbox insert fails")
	}
	if after := pgtest.LedgerState(t, pool); !maps.Equal(before, after) {
		t.Fatalf("a failed posting left a trace:\nbefore %v\nafter  %v", before, after)
	}
	var keys int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 'during'`).Scan(&keys); err != nil || keys != 0 {
		t.Fatalf("idempotency key of the failed posting: %d rows, %v", keys, err)
	}

	if _, err := pool.Exec(ctx, `DROP TRIGGER fail_outbox ON outbox`); err != nil {
		t.Fatal(err)
	}
	res, _, err := store.Post(ctx, "during", p)
	if err != nil {
		t.Fatalf("negative control: the same posting without the fault: %v", err)
	}
	if res.Events[0].Revision != 2 || res.Events[1].Revision != 1 {
		t.Fatalf("revisions after the failed attempt: %+v, want a at 2 and c at 1", res.Events)
	}
}

// 16 writers × 200 postings over 10 shared accounts in two currencies:
// per account the revisions are exactly 1..K, there is one outbox event per
// revision and the outbox id order is the revision order; per currency the
// balances sum to zero and every balance equals the sum of its lines.
func TestConcurrentPostingsKeepRevisionsGapless(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	store := ledgerstore.New(pool, ledgerstore.Config{})
	const writers, perWriter, nAccounts = 16, 200, 10
	if testing.Short() {
		t.Skip("3,200 postings; skipped in -short")
	}
	var posters errgroup.Group
	for w := 0; w < writers; w++ {
		posters.Go(func() error {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < perWriter; i++ {
				if _, _, err := store.Post(ctx, fmt.Sprintf("w%d-%d", w, i), randomPosting(r, nAccounts)); err != nil {
					return fmt.Errorf("writer %d posting %d: %w", w, i, err)
				}
			}
			return nil
		})
	}
	if err := posters.Wait(); err != nil {
		t.Fatal(err)
	}
	if v := ledgerViolations(t, pool, writers*perWriter); len(v) > 0 {
		t.Fatalf("ledger invariants broken:\n%s", strings.Join(v, "\n"))
	}
	// Negative control: the checker sees a lost event, a revision gap and
	// a balance that drifted from its lines. (A repeated revision cannot
	// even be written: journal_lines is unique on account and revision.)
	if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE id = (SELECT max(id) FROM outbox);
UPDATE journal_lines SET revision = revision + 1000 WHERE (account_id, revision) IN (SELECT id, revision FROM account_revisions WHERE id = 'acc-3')`); err != nil {
		t.Fatal(err)
	}
	pgtest.ShiftBalance(t, pool, "acc-4", 1)
	if v := ledgerViolations(t, pool, writers*perWriter); len(v) < 3 {
		t.Fatalf("negative control: the checker found only %q after three corruptions", v)
	}
}

// randomPosting returns a balanced posting of 2 to 4 lines over accounts
// acc-0 … acc-(n-1), in EUR or USD, sometimes with the same account twice.
func randomPosting(r *rand.Rand, n int) core.Posting {
	cur := []string{"EUR", "USD"}[r.IntN(2)]
	amount := 1 + r.Int64N(1000)
	acc := func() string { return "acc-" + strconv.Itoa(r.IntN(n)) }
	p := transfer(acc(), acc(), amount, cur)
	if r.IntN(2) == 0 { // split the credit over two lines
		part := amount / 2
		if part > 0 {
			p.Entries[1].Amount -= part
			p.Entries = append(p.Entries, core.Entry{Account: acc(), Direction: core.Credit, Amount: part, Currency: cur})
		}
	}
	return p
}

// revisionsOf groups the (account, revision) rows query returns by
// account, each account's revisions in row order.
func revisionsOf(t *testing.T, pool *pgxpool.Pool, query string) map[string][]int64 {
	t.Helper()
	out := map[string][]int64{}
	rows, _ := pool.Query(context.Background(), query) // a failed query surfaces in rows.Err
	for rows.Next() {
		var a string
		var r int64
		if err := rows.Scan(&a, &r); err != nil {
			t.Fatal(err)
		}
		out[a] = append(out[a], r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ledgerViolations lists every broken ledger invariant.
func ledgerViolations(t *testing.T, pool *pgxpool.Pool, wantJournals int) []string {
	t.Helper()
	var v []string
	ctx := context.Background()
	var journals, maxSeq int
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(sequence), 0) FROM journals`).Scan(&journals, &maxSeq); err != nil {
		t.Fatal(err)
	}
	if journals != wantJournals {
		v = append(v, fmt.Sprintf("%d journals, want %d", journals, wantJournals))
	}
	// Per account: line revisions, outbox revisions in id order, and the
	// account's own revision.
	lines := revisionsOf(t, pool, `SELECT account_id, revision FROM journal_lines ORDER BY account_id, revision`)
	events := revisionsOf(t, pool, `SELECT aggregate_id, revision FROM outbox WHERE kind = 'event' AND aggregate_type = 'account' ORDER BY id`)
	accRev := revisionsOf(t, pool, `SELECT id, revision FROM account_revisions`) // one row per account
	if len(accRev) == 0 {
		t.Fatal("no accounts")
	}
	for a, revs := range accRev {
		k := revs[0]
		want := make([]int64, k)
		for i := range want {
			want[i] = int64(i + 1)
		}
		if !slices.Equal(lines[a], want) {
			v = append(v, fmt.Sprintf("account %s: line revisions are not exactly 1..%d (%d lines)", a, k, len(lines[a])))
		}
		if !slices.Equal(events[a], want) {
			v = append(v, fmt.Sprintf("account %s: outbox events in id order are not exactly revisions 1..%d (%d events)", a, k, len(events[a])))
		}
	}
	// Balances: per currency zero, and each equal to its lines' sum.
	var mismatched, unbalanced int
	if err := pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM account_balances b FULL JOIN (
		SELECT account_id, currency, sum(CASE direction WHEN 'credit' THEN amount ELSE -amount END) AS s
		FROM journal_lines GROUP BY 1, 2) l USING (account_id, currency)
	 WHERE b.balance IS DISTINCT FROM l.s),
	(SELECT count(*) FROM (SELECT currency FROM account_balances GROUP BY 1 HAVING sum(balance) <> 0) x)`).Scan(&mismatched, &unbalanced); err != nil {
		t.Fatal(err)
	}
	if mismatched != 0 {
		v = append(v, fmt.Sprintf("%d balances differ from the sum of their lines", mismatched))
	}
	if unbalanced != 0 {
		v = append(v, fmt.Sprintf("%d currencies' balances do not sum to zero", unbalanced))
	}
	return v
}

func TestIdempotentPost(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	store := ledgerstore.New(pool, ledgerstore.Config{})
	p := transfer("a", "b", 7, "EUR")
	first, replayed, err := store.Post(ctx, "k", p)
	if err != nil || replayed {
		t.Fatalf("first: replayed=%v err=%v", replayed, err)
	}
	again, replayed, err := store.Post(ctx, "k", transfer("a", "b", 7, "EUR"))
	if err != nil || !replayed {
		t.Fatalf("same request again: replayed=%v err=%v", replayed, err)
	}
	first.PostedAt, again.PostedAt = first.PostedAt.UTC(), first.PostedAt.UTC()
	if fmt.Sprint(first) != fmt.Sprint(again) {
		t.Fatalf("replay differs:\n%+v\n%+v", first, again)
	}
	if _, _, err := store.Post(ctx, "k", transfer("a", "b", 8, "EUR")); !errors.Is(err, core.ErrIdempotencyConflict) {
		t.Fatalf("other request under the same key: err = %v, want ErrIdempotencyConflict", err)
	}
	var journals int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM journals`).Scan(&journals); err != nil || journals != 1 {
		t.Fatalf("%d journals (%v), want 1", journals, err)
	}
}

// A balance that would leave int64 is refused naming the entry and writes
// nothing; a retry of an earlier posting still gets its stored answer even
// though redoing it now would overflow.
func TestPostRefusesBalanceOverflow(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	ctx := context.Background()
	store := ledgerstore.New(pool, ledgerstore.Config{})
	const big = 999_999_999_999_999_999 // 18 digits, the largest amount
	p := transfer("src", "sink", big, "EUR")
	for i := 0; i < 9; i++ { // 9 × ~1e18 < MaxInt64 ≈ 9.22e18
		if _, _, err := store.Post(ctx, "ok-"+strconv.Itoa(i), p); err != nil {
			t.Fatalf("posting %d: %v", i, err)
		}
	}
	before := pgtest.LedgerState(t, pool)
	_, _, err := store.Post(ctx, "overflow", p)
	var ie *core.InputError
	if !errors.As(err, &ie) || ie.Field != "entries[0].amount" || ie.Malformed {
		t.Fatalf("err = %v, want a 422 InputError naming entries[0].amount", err)
	}
	if after := pgtest.LedgerState(t, pool); !maps.Equal(before, after) {
		t.Fatalf("refused posting left a trace:\nbefore %v\nafter  %v", before, after)
	}
	if _, replayed, err := store.Post(ctx, "ok-0", p); err != nil || !replayed {
		t.Fatalf("retry of an earlier posting: replayed=%v err=%v, want the stored answer", replayed, err)
	}
}

func TestOutboxSchemaRefusesMessagesWithoutContractHeaders(t *testing.T) {
	t.Parallel()
	env := core.Envelope{EventID: "0190a8a0-0000-7000-8000-000000000001", Kind: core.KindEvent, Type: core.TypeAccountPosted,
		AggregateType: core.AggregateAccount, AggregateID: "a", Revision: 1}
	noTime := env.ToMessage()
	noTime.Metadata.Set(core.HeaderOccurredAt, "")
	for name, msg := range map[string]*message.Message{
		"no headers":      message.NewMessage(env.EventID, []byte("{}")),
		"no occurred_at":  noTime,
		"UUID ≠ event_id": func() *message.Message { m := env.ToMessage(); m.UUID = "other"; return m }(),
	} {
		if _, err := (ledgerstore.OutboxSchema{}).InsertQuery(wsql.InsertQueryParams{Topic: core.TopicEvents, Msgs: message.Messages{msg}}); !errors.Is(err, core.ErrBadEnvelope) {
			t.Errorf("%s: err = %v, want ErrBadEnvelope", name, err)
		}
	}
	if _, err := (ledgerstore.OutboxSchema{}).SelectQuery(wsql.SelectQueryParams{}); !errors.Is(err, ledgerstore.ErrOutboxReadOnly) {
		t.Errorf("SelectQuery err = %v", err)
	}
	if _, err := (ledgerstore.OutboxSchema{}).SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{}); err == nil {
		t.Error("SchemaInitializingQueries must refuse: the outbox comes from migrations")
	}
}

// A committed posting wakes listening relays with a NOTIFY sent after the
// commit; without a posting nothing arrives (the control that shows the
// wait can fail).
func TestPostWakesListeningRelays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := pgtest.Ledger(t)
	conn := pgtest.Listen(t, url, postgres.NotifyChannel)
	quiet, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := conn.WaitForNotification(quiet)
	cancel()
	if err == nil {
		t.Fatal("a notification arrived before any posting")
	}
	store := ledgerstore.New(pool, ledgerstore.Config{})
	if _, _, err := store.Post(ctx, "wake-1", transfer("acc-a", "acc-b", 5, "EUR")); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wait)
	if err != nil {
		t.Fatalf("no wake-up after a committed posting: %v", err)
	}
	if n.Channel != postgres.NotifyChannel {
		t.Fatalf("notification on %q", n.Channel)
	}
}
