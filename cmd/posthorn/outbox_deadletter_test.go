package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// A record the sink can never take parks its account on the relay; a
// release parks it again (the control: without the dead-letter action the
// account stays parked and its later event never reaches the consumers).
// posthorn outbox dead-letter moves the record to dead_letters with the
// operator, writes the decision to the audit log, and the account's later
// event flows: each example consumer records the dead-lettered revision as
// skipped, by name, and applies the next one.
func TestOutboxDeadLetterLetsTheAggregateFlow(t *testing.T) {
	t.Parallel()
	// Records over 4 KiB are rejected for good.
	r := newConsoleRig(t, consoleToken, memory.Config{MaxPayloadBytes: 4096})
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	defer startRigRelay(t, ctx, r.ledger, r.sink, "dead-letter-test", "memory", 20*time.Millisecond)()
	cfg, err := configs.Load("", r.env, nil)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := runConsumers(ctx, cfg, consumeOptions{memory: r.sink.Subscriber(), log: slog.New(slog.DiscardHandler)}); err != nil {
			t.Errorf("consumers: %v", err)
		}
	})

	post := func(key string) {
		t.Helper()
		if _, _, err := r.store.Post(ctx, key, core.Posting{Entries: []core.Entry{
			{Account: "acc-dl", Direction: core.Debit, Amount: 10, Currency: "EUR"},
			{Account: "acc-other", Direction: core.Credit, Amount: 10, Currency: "EUR"},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	post("dl-1") // acc-dl revision 1
	var big relaytest.Posted
	if err := pgx.BeginFunc(ctx, r.ledger, func(tx pgx.Tx) error {
		rev, err := relaytest.Lock(ctx, tx, "acc-dl")
		if err != nil {
			return err
		}
		big, err = relaytest.Insert(ctx, tx, "acc-dl", rev, fmt.Appendf(nil, `{"pad":%q}`, strings.Repeat("x", 8192)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	post("dl-3") // acc-dl revision 3, behind the record the sink refuses
	parked := func() bool {
		return r.count(false, `SELECT count(*) FROM relay_parked WHERE aggregate_id = 'acc-dl'`) == 1
	}
	position := func(consumer string) int64 {
		last, err := inboxstore.New(r.consumer).LastRevision(ctx, consumer, core.AggregateAccount, "acc-dl")
		if err != nil {
			t.Fatal(err)
		}
		return last
	}
	wait.For(t, 10*time.Second, "the relay to park acc-dl", parked)
	wait.For(t, 10*time.Second, "revision 1 applied", func() bool { return position(projection.Name) == 1 })

	// Control: a release sends the same record, which the sink refuses
	// again; acc-dl parks again and revision 3 does not arrive.
	r.run("outbox", "release", "--account", "acc-dl")
	wait.For(t, 10*time.Second, "acc-dl parked again after the release", parked)
	if p := position(projection.Name); p != 1 {
		t.Fatalf("control: after a release the projection is at revision %d of acc-dl, want 1 (still parked)", p)
	}

	code, stdout, stderr := runCLI(t, r.env, "outbox", "dead-letter", "--aggregate-type", "account", "--aggregate-id", "acc-dl",
		"--event-id", big.EventID, "--operator", "alice")
	if code != 0 || !strings.Contains(stdout, "moved to the dead_letters table") {
		t.Fatalf("dead-letter: exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Log(strings.TrimSpace(stdout))
	// The projection is ordered: it applies revision 3 only past the skip.
	wait.For(t, 15*time.Second, "the projection past the dead-lettered revision", func() bool { return position(projection.Name) == 3 })
	for _, c := range exampleNames() {
		var rec core.InboxRecord
		var ok bool
		wait.For(t, 15*time.Second, c+" to record the skip marker", func() bool {
			recs, err := inboxstore.New(r.consumer).Dispositions(ctx, c, []string{big.EventID})
			if err != nil {
				t.Fatal(err)
			}
			rec, ok = recs[big.EventID]
			return ok
		})
		if rec.Disposition != core.DispositionSkipped || !strings.Contains(rec.Reason, `dead-lettered by an operator (type "ledger.account.posted"`) {
			t.Fatalf("%s recorded the dead-lettered event as %+v, want %s with a reason naming it", c, rec, core.DispositionSkipped)
		}
		t.Logf("%s: %s %s", c, rec.Disposition, rec.Reason)
	}
	var op, reason string
	var size int
	if err := r.ledger.QueryRow(ctx, `SELECT operator, reason, octet_length(payload) FROM dead_letters WHERE event_id = $1`,
		big.EventID).Scan(&op, &reason, &size); err != nil {
		t.Fatalf("dead_letters row: %v", err)
	}
	if op != "alice" || size < 8192 || !strings.Contains(reason, "larger than the sink accepts") {
		t.Fatalf("dead_letters row: operator %q, %d payload bytes, reason %q", op, size, reason)
	}
	if n := r.count(false, `SELECT count(*) FROM console_audit WHERE action = 'dead-letter' AND operator = 'alice' AND outcome = 'ok'`); n != 1 {
		t.Fatalf("%d audit entries of the dead-letter", n)
	}
	if parked() {
		t.Fatal("acc-dl is still parked")
	}
	// A second dead-letter is refused by name: nothing is parked any more.
	if code, _, stderr := runCLI(t, r.env, "outbox", "dead-letter", "--aggregate-type", "account", "--aggregate-id", "acc-dl", "--operator", "alice"); code == 0 || !strings.Contains(stderr, "aggregate_id:") {
		t.Fatalf("second dead-letter: exit %d %s", code, stderr)
	}
}

// The console's Dead-letter button beside Release: it is on the relay's
// parked row, refuses another event ID by name without changing anything,
// and with the token dead-letters the record, audited like Release.
func TestConsoleDeadLetterIsAudited(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, consoleToken, memory.Config{})
	acc2 := r.parkBoth()
	if _, body := r.get("/"); !strings.Contains(body, "action=dead-letter-relay") {
		t.Fatalf("no Dead-letter button on the parked row:\n%s", body)
	}
	before := r.state()
	form := url.Values{"aggregate_type": {"account"}, "aggregate_id": {"acc-2"}, "event_id": {"0194d1a0-0000-7000-8000-000000000000"}}
	form.Set("csrf", r.confirm("dead-letter-relay", form))
	form.Set("token", consoleToken)
	form.Set("operator", "bob")
	if status, _, body := r.post("dead-letter-relay", form); status != 422 || !strings.Contains(body, "event_id:") {
		t.Fatalf("another event ID: %d\n%s", status, body)
	}
	if after := r.state(); after != before {
		t.Fatalf("a refused dead-letter changed %s to %s", before, after)
	}
	form.Set("event_id", acc2)
	if status, loc, body := r.post("dead-letter-relay", form); status != 303 {
		t.Fatalf("dead-letter: %d %s\n%s", status, loc, body)
	}
	if n := r.count(false, `SELECT count(*) FROM console_audit WHERE action = 'dead-letter-relay' AND operator = 'bob' AND outcome = 'ok'`); n != 1 {
		t.Fatalf("%d audit entries", n)
	}
	if n := r.count(false, fmt.Sprintf(`SELECT count(*) FROM dead_letters WHERE event_id = '%s' AND operator = 'bob'`, acc2)); n != 1 {
		t.Fatalf("%d dead_letters rows", n)
	}
	if n := r.count(false, fmt.Sprintf(`SELECT count(*) FROM outbox WHERE event_id = '%s' AND type = '%s'`, acc2, core.TypeDeadLettered)); n != 1 {
		t.Fatal("the outbox row is not the skip marker")
	}
}

// posthorn_publish refuses at write time a payload the configured sink
// can never carry, naming the field and the limit, and writes nothing. The
// limit is what migrate writes for the sink (Kafka: 1,000,000 bytes a
// record); the control is the former fixed check, under which the same
// 999,000-byte payload was accepted and then parked by the Kafka sink.
func TestPublishRefusesWhatTheSinkCannotCarry(t *testing.T) {
	t.Parallel()
	dsn, pool := pgtest.Ledger(t)
	ctx := context.Background()
	limit := sinkMaxRecordBytes(configs.Sink{Kind: "kafka"})
	if err := postgres.WriteSettings(ctx, dsn, postgres.Settings{CommandTopicPrefix: "commands.", IdempotencyKeyTTL: 720 * time.Hour,
		MaxRecordBytes: limit}); err != nil {
		t.Fatal(err)
	}
	payload := `{"pad":"` + strings.Repeat("x", 999_000) + `"}`
	rows := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := rows()
	_, err := pool.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', 'w-1', 'wallet.credited', $1::jsonb)`, payload)
	if err == nil || !strings.Contains(err.Error(), "payload: is ") || !strings.Contains(err.Error(), "1000000") {
		t.Fatalf("a %d-byte payload for Kafka: %v, want a refusal naming payload and the limit", len(payload), err)
	}
	t.Logf("refused: %v", err)
	if rows() != before {
		t.Fatal("the refused publish wrote a row")
	}
	if _, err := pool.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', 'w-1', 'wallet.credited', '{"small":true}'::jsonb)`); err != nil {
		t.Fatalf("a small payload: %v", err)
	}
	// Control: a sink that carries it (the old 1,000,000-byte payload
	// check let the same payload in whatever the sink).
	if err := postgres.WriteSettings(ctx, dsn, postgres.Settings{CommandTopicPrefix: "commands.", IdempotencyKeyTTL: 720 * time.Hour,
		MaxRecordBytes: sinkMaxRecordBytes(configs.Sink{Kind: "amqp"})}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT * FROM posthorn_publish('wallet', 'w-1', 'wallet.credited', $1::jsonb)`, payload); err != nil {
		t.Fatalf("control: the same payload for AMQP (128 MiB): %v", err)
	}
}
