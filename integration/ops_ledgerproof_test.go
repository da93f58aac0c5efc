package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
)

// blindLedger is the ledger store with the ledger proof switched off: its
// cuts read an empty journal proof. It is the negative control of the
// attacks below, showing that only the proof names them (what reconcile
// said before it proved the ledger from its journal).
type blindLedger struct{ ops.Store }

func (b blindLedger) OpenCut(ctx context.Context, req ops.CutRequest) (*ops.Cut, error) {
	c, err := b.Store.OpenCut(ctx, req)
	if err == nil {
		c.CutReader = blindCut{c.CutReader}
	}
	return c, err
}

type blindCut struct{ ops.CutReader }

func (blindCut) LedgerReader(context.Context) (ops.LedgerReader, error) { return blindReader{}, nil }

type blindReader struct{}

func (blindReader) JournalDrift(context.Context) (ops.JournalDrift, error) {
	return ops.JournalDrift{}, nil
}
func (blindReader) AccountEvents(context.Context, int, func([]ops.AccountEvent) error) error {
	return nil
}
func (blindReader) LineSums(context.Context, []ops.ProjectedBalance) ([]ops.LineSum, error) {
	return nil, nil
}
func (blindReader) Close() {}

func (r *opsRig) reconcileWith(t *testing.T, ledger ops.Store, sources []ops.ConsumerSource) ops.Report {
	t.Helper()
	rep, err := ops.Reconcile(context.Background(), ops.ReconcileConfig{Ledger: ledger, Consumers: sources, Record: true})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// assertLedgerNames checks that the proof is not clean, names want in
// class, records no coverage, and that the blind run (negative control)
// says clean over the same rows.
func assertLedgerNames(t *testing.T, r *opsRig, what string, class func(ops.LedgerProof) ops.Class, want string) {
	t.Helper()
	blind := r.reconcileWith(t, blindLedger{r.ops}, r.sources())
	if !blind.Clean {
		t.Fatalf("%s, negative control: without the ledger proof the run should be clean (the attack is invisible to the matching), got %+v", what, blind)
	}
	before := coverageRows(t, r) // the blind run recorded coverage; the proof's must not move it
	rep := r.reconcile(t, nil)
	if rep.Clean || rep.Ledger.Clean() {
		t.Fatalf("%s: reconcile says clean: %+v", what, rep.Ledger)
	}
	assertClass(t, what, class(rep.Ledger), want)
	for _, c := range rep.Consumers {
		if c.Coverage != nil {
			t.Fatalf("%s: coverage recorded for %s on a ledger that disagrees with its journal", what, c.Name)
		}
	}
	if after := coverageRows(t, r); !equalCoverage(after, before) {
		t.Fatalf("%s: coverage moved: %v → %v", what, before, after)
	}
	if len(rep.Ledger.Details) == 0 || !strings.Contains(rep.Ledger.Details[0].Account+rep.Ledger.Details[0].EventID, strings.Fields(want)[0]) {
		t.Fatalf("%s: details do not name %s: %+v", what, want, rep.Ledger.Details)
	}
}

// A balance changed behind the ledger's back is named by account and
// currency; so is a revision.
func TestOpsReconcileProvesBalancesAndRevisionsFromTheJournal(t *testing.T) {
	t.Parallel()
	r := newOpsRig(t)
	r.deliver(t, 12)
	if rep := r.reconcile(t, nil); !rep.Clean || rep.Ledger.Accounts != int64(len(opsAccounts)) || rep.Ledger.Events == 0 {
		t.Fatalf("untouched ledger: clean %v, proof %+v", rep.Clean, rep.Ledger)
	}

	pgtest.ShiftBalance(t, r.ledger, "acc-bob", 100000000)
	assertLedgerNames(t, r, "balance", func(p ops.LedgerProof) ops.Class { return p.BalanceMismatch }, "acc-bob EUR")
	pgtest.ShiftBalance(t, r.ledger, "acc-bob", -100000000)

	// The floor raised past the account's lines, as a forged recovery would.
	mustExec(t, r.ledger, `UPDATE accounts SET revision = (SELECT revision + 1 FROM account_revisions WHERE id = 'acc-carol') WHERE id = 'acc-carol'`)
	assertLedgerNames(t, r, "revision", func(p ops.LedgerProof) ops.Class { return p.RevisionMismatch }, "acc-carol")
}

// A forged ledger event (an outbox row of an account with a delta no
// journal line has) is named even after the relay sent it and both
// consumers applied it; so is a real event whose payload was rewritten.
func TestOpsReconcileNamesForgedLedgerEvents(t *testing.T) {
	t.Parallel()
	r := newOpsRig(t)
	events := r.deliver(t, 12)

	var rev int64
	if err := r.ledger.QueryRow(context.Background(), `SELECT revision FROM account_revisions WHERE id = 'acc-bob'`).Scan(&rev); err != nil {
		t.Fatal(err)
	}
	forged := uuid.Must(uuid.NewV7()).String()
	mustExec(t, r.ledger, `
INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, payload, occurred_at)
VALUES ($1::uuid, 'event', 'ledger.account.posted', 'ledger.events', 'account', 'acc-bob', $2, $3,
        convert_to(json_build_object('event_id', $1::text, 'account', 'acc-bob', 'revision', $2::bigint,
                                     'currency', 'EUR', 'delta', '100000000', 'posted_at', now())::text, 'UTF8'), now())`,
		forged, rev+1, core.ShardOf("acc-bob"))
	r.relay(t, nil)
	r.waitApplied(t, events+1)
	assertLedgerNames(t, r, "forged event", func(p ops.LedgerProof) ops.Class { return p.EventMismatch }, forged)

	// The forged row goes; a real event's delta is rewritten.
	mustExec(t, r.ledger, `DELETE FROM outbox WHERE event_id = $1`, forged)
	mustExec(t, r.consumer, `DELETE FROM consumer_inbox WHERE event_id = $1`, forged)
	real := r.posted[4].Events[0].EventID
	mustExec(t, r.ledger, `UPDATE outbox SET payload = convert_to(replace(convert_from(payload, 'UTF8'), '"delta":"', '"delta":"9'), 'UTF8') WHERE event_id = $1`, real)
	assertLedgerNames(t, r, "rewritten delta", func(p ops.LedgerProof) ops.Class { return p.EventMismatch }, real)
}

// The projection's balances, changed in the consumer's database, are named
// for a consumer that declares them as its balance view.
func TestOpsReconcileHoldsTheBalanceViewAgainstTheJournal(t *testing.T) {
	t.Parallel()
	r := newOpsRig(t)
	r.deliver(t, 12)
	view, err := opsstore.NewBalanceView(r.consumer, projection.BalanceView)
	if err != nil {
		t.Fatal(err)
	}
	withView := r.sources()
	withView[0].BalanceView = view
	rep := r.reconcileWith(t, r.ops, withView)
	if v := rep.Consumers[0].BalanceView; !rep.Clean || v == nil || v.Compared != int64(len(opsAccounts)) {
		t.Fatalf("untouched projection: clean %v, view %+v", rep.Clean, v)
	}

	mustExec(t, r.consumer, `UPDATE projection_balances SET balance = balance + 500 WHERE account = 'acc-bob'`)
	// Negative control: without the view declared, the matching alone says clean.
	if blind := r.reconcileWith(t, r.ops, r.sources()); !blind.Clean {
		t.Fatalf("negative control: without a balance view the run should be clean, got %+v", blind)
	}
	before := coverageRows(t, r)
	rep = r.reconcileWith(t, r.ops, withView)
	proj := consumerReport(t, rep, projection.Name)
	if rep.Clean || proj.Clean || proj.Coverage != nil {
		t.Fatalf("changed projection: report clean %v, projection clean %v coverage %+v", rep.Clean, proj.Clean, proj.Coverage)
	}
	assertClass(t, "balance view", proj.BalanceView.Mismatch, "acc-bob EUR")
	if after := coverageRows(t, r); after[projection.Name].CoveredOutboxID != before[projection.Name].CoveredOutboxID ||
		!after[projection.Name].VerifiedAt.Equal(before[projection.Name].VerifiedAt) {
		t.Fatalf("projection coverage moved: %v → %v", before[projection.Name], after[projection.Name])
	}
}

// walletConsumer runs a consumer of the wallet events the publish
// functions write (topic events.wallet) and returns its source.
func walletConsumer(t *testing.T, r *opsRig) ops.ConsumerSource {
	t.Helper()
	const name = "wallet-audit"
	reg := newRegistry(t, r.consumer, 10*time.Second, consumers.Config{
		Subscribers: func(string) (message.Subscriber, error) { return r.sink.Subscriber(), nil },
	})
	if err := reg.AddEventHandler(name, "events.wallet", func(context.Context, pgx.Tx, core.Envelope) error { return nil }); err != nil {
		t.Fatal(err)
	}
	runRegistry(t, reg, t.Errorf)
	return ops.ConsumerSource{Name: name, Reader: ops.InboxReader{Inbox: inboxstore.New(r.consumer), Consumer: name},
		Topics: []string{"events.wallet"}}
}

// Events a team publishes with posthorn_publish are in the cut: with no
// consumer configured for their topic they are named and never covered
// (the coverage recorded stops below the first); with one, they are
// matched against its dispositions like the ledger's own.
func TestOpsReconcileCoversPublishedEvents(t *testing.T) {
	t.Parallel()
	r := newOpsRig(t)
	events := r.post(t, 4)
	var published []string
	var firstID int64
	for i := range 3 {
		var id string
		if err := r.ledger.QueryRow(context.Background(),
			`SELECT event_id::text FROM posthorn_publish('wallet', 'w-1', 'wallet.credited', jsonb_build_object('n', $1::int))`, i).Scan(&id); err != nil {
			t.Fatal(err)
		}
		published = append(published, id)
	}
	if err := r.ledger.QueryRow(context.Background(), `SELECT min(id) FROM outbox WHERE topic = 'events.wallet'`).Scan(&firstID); err != nil {
		t.Fatal(err)
	}
	events += r.post(t, 4)
	r.relay(t, nil)
	r.waitApplied(t, events)

	rep := r.reconcile(t, nil)
	if rep.Clean {
		t.Fatalf("published events no consumer is configured for, yet clean: %+v", rep)
	}
	assertClass(t, "unwatched", rep.Unwatched, published...)
	if len(rep.UnwatchedTopics) == 0 || rep.UnwatchedTopics[len(rep.UnwatchedTopics)-1].Topic != "events.wallet" {
		t.Fatalf("unwatched topics %+v, want events.wallet named", rep.UnwatchedTopics)
	}
	for _, c := range rep.Consumers {
		if !c.Clean || c.Coverage == nil || c.Coverage.CoveredOutboxID >= firstID {
			t.Fatalf("%s: clean %v coverage %+v; want clean with coverage below the first unwatched event (id %d)", c.Name, c.Clean, c.Coverage, firstID)
		}
	}

	wallet := walletConsumer(t, r)
	wait.For(t, opsWait, "wallet consumer applied", func() bool {
		return counts(t, r.consumer, wallet.Name).Events[core.DispositionApplied] == int64(len(published))
	})
	sources := append(r.sources(), wallet)
	rep = r.reconcileWith(t, r.ops, sources)
	if !rep.Clean || rep.Unwatched.Count != 0 {
		t.Fatalf("with a consumer of events.wallet: clean %v unwatched %+v %+v", rep.Clean, rep.Unwatched, rep.Consumers)
	}
	w := consumerReport(t, rep, wallet.Name)
	if w.Expected != int64(len(published)) || w.Applied != int64(len(published)) {
		t.Fatalf("wallet consumer: expected %d applied %d, want %d", w.Expected, w.Applied, len(published))
	}
	if maxID := r.count(t, `SELECT max(id) FROM outbox`); rep.Cut.CoveredOutboxID != maxID || w.Coverage == nil || w.Coverage.CoveredOutboxID != maxID {
		t.Fatalf("covered outbox id %d (recorded %+v), want %d", rep.Cut.CoveredOutboxID, w.Coverage, maxID)
	}

	// Control: the published events are matched, not merely counted: one
	// the wallet consumer has no disposition for is unproven.
	mustExec(t, r.consumer, `DELETE FROM consumer_inbox WHERE consumer = $1 AND event_id = $2`, wallet.Name, published[1])
	rep = r.reconcileWith(t, r.ops, sources)
	assertClass(t, "wallet unproven", consumerReport(t, rep, wallet.Name).Discrepancies.Unproven, published[1])
}

// The covered outbox id names a row: ids a rolled-back transaction took
// are not reported as covered.
func TestOpsReconcileCoveredIDIsARow(t *testing.T) {
	t.Parallel()
	r := newOpsRig(t)
	r.deliver(t, 1)
	mustExec(t, r.ledger, `SELECT nextval('outbox_id_seq') FROM generate_series(1, 2)`)
	rep := r.reconcile(t, nil)
	maxID := r.count(t, `SELECT max(id) FROM outbox`)
	last := r.count(t, `SELECT last_value FROM outbox_id_seq`)
	if last != maxID+2 {
		t.Fatalf("control: the sequence is at %d, want %d past the last row %d", last, maxID+2, maxID)
	}
	if !rep.Clean || rep.Cut.CoveredOutboxID != maxID {
		t.Fatalf("covered outbox id %d (clean %v), want the last row's %d, not the sequence's %d", rep.Cut.CoveredOutboxID, rep.Clean, maxID, last)
	}
}
