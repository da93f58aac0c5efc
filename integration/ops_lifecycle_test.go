package integration

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/fsarchive"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay/polling"
)

var required = []string{projection.Name, auditlog.Name}

// Replay, archive, cleanup and a replay of the cleaned range, end to end:
// replays carry the same event IDs and the replay header, consumers absorb
// them as duplicates and balances do not move; commands stay home without
// the flag; cleanup refuses until archive, coverage and the replay window
// allow it, then deletes exactly the rows of the covered journals.
func TestOpsReplayArchiveCleanupLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsRig(t)
	events := r.deliver(t, 40)
	r.assertBalancesMatch(t)
	cmdTopic := core.CommandTopic(core.CommandTopicPrefix, "payouts.payout.execute")
	commands := len(r.sink.Records(cmdTopic))
	if commands == 0 {
		t.Fatal("no command was relayed: the command checks below prove nothing")
	}

	// Replay everything: same IDs, replay header, absorbed, balances unchanged.
	sentBefore := len(r.sink.Records(core.TopicEvents))
	res, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink, Name: "all-once", Batch: 7})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != int64(events) {
		t.Fatalf("replayed %d, want %d events", res.Sent, events)
	}
	recs := r.sink.Records(core.TopicEvents)
	original := map[string]bool{}
	for _, m := range recs[:sentBefore] {
		original[m.UUID] = true
	}
	for i, m := range recs[sentBefore:] {
		if !original[m.UUID] || m.Metadata.Get(core.HeaderEventID) != m.UUID || m.Metadata.Get(core.HeaderReplay) != "true" {
			t.Fatalf("replayed record %d: id %s (header %s) replay %q: not an original event ID with the replay header",
				i, m.UUID, m.Metadata.Get(core.HeaderEventID), m.Metadata.Get(core.HeaderReplay))
		}
		delete(original, m.UUID)
	}
	if len(original) != 0 {
		t.Fatalf("%d events not replayed", len(original))
	}
	if got := len(r.sink.Records(cmdTopic)); got != commands {
		t.Fatalf("commands on %s went from %d to %d without --include-commands", cmdTopic, commands, got)
	}
	r.waitDuplicates(t, int64(events))
	r.assertBalancesMatch(t)
	// The finished replay is not sent twice under its name.
	if again, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink, Name: "all-once"}); err != nil || !again.AlreadyDone {
		t.Fatalf("second run of a finished replay: %+v, %v", again, err)
	}
	// A resume with another range is refused.
	if _, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink, Name: "all-once", Spec: ops.ReplaySpec{Account: "acc-bob"}}); !errors.Is(err, ops.ErrReplaySpecChanged) {
		t.Fatalf("resume with another range: %v", err)
	}
	// Commands only with the flag, to a named topic.
	res, err = ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink, Spec: ops.ReplaySpec{IncludeCommands: true, Account: "none", Topic: "replay.audit"}})
	if err != nil || res.Sent != 0 {
		t.Fatalf("account filter: %+v %v", res, err)
	}
	res, err = ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink, Spec: ops.ReplaySpec{IncludeCommands: true, Topic: "replay.audit"}})
	if err != nil || res.Sent != int64(events+commands) || len(r.sink.Records("replay.audit")) != events+commands {
		t.Fatalf("replay with commands to a named topic: %+v %v, %d records", res, err, len(r.sink.Records("replay.audit")))
	}

	archive, err := fsarchive.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cleanup := func(window time.Duration, req []string, dry bool) (ops.CleanupResult, error) {
		return ops.Cleanup(ctx, ops.CleanupConfig{Ledger: r.ops, Archive: archive, Required: req, ReplayWindow: window, BatchSize: 13, DryRun: dry})
	}
	// No coverage yet: archive and cleanup refuse.
	if _, err := ops.Archive(ctx, ops.ArchiveConfig{Ledger: r.ops, Archive: archive, Required: required}); !errors.Is(err, ops.ErrNoCoverage) {
		t.Fatalf("archive without coverage: %v", err)
	}
	if _, err := cleanup(0, required, false); !refusedWith(err, "no archive coverage") {
		t.Fatalf("cleanup without archive coverage: %v", err)
	}
	if rep := r.reconcile(t, nil); !rep.Clean {
		t.Fatalf("reconcile: %+v", rep)
	}
	cut := r.posted[len(r.posted)-1].Sequence

	// Later postings, relayed but not reconciled: outside coverage.
	later := r.post(t, 10)
	r.relay(t, nil)
	r.waitApplied(t, events+later)

	ares, err := ops.Archive(ctx, ops.ArchiveConfig{Ledger: r.ops, Archive: archive, Required: required, SegmentRows: 25})
	if err != nil {
		t.Fatal(err)
	}
	coveredRows := r.count(t, `SELECT count(*) FROM outbox o JOIN journals j ON j.id = o.journal_id WHERE j.sequence <= $1`, cut)
	if ares.Rows != coveredRows || len(ares.Segments) < 2 {
		t.Fatalf("archived %d rows in %d segments, want the %d rows of the covered journals in several", ares.Rows, len(ares.Segments), coveredRows)
	}
	if v, err := ops.VerifyArchive(ctx, r.ops, archive); err != nil || len(v.Problems) != 0 || v.Rows != coveredRows {
		t.Fatalf("verify: %+v %v", v, err)
	}

	// Without a required consumer's coverage; inside the replay window.
	if _, err := cleanup(0, append(required, "ledger-export"), false); !refusedWith(err, "consumer ledger-export has no verified coverage") {
		t.Fatalf("cleanup without a consumer's coverage: %v", err)
	}
	if _, err := cleanup(time.Hour, required, false); !refusedWith(err, "inside the replay window") {
		t.Fatalf("cleanup inside the replay window: %v", err)
	}
	total := r.count(t, `SELECT count(*) FROM outbox`)
	dry, err := cleanup(0, required, true)
	if err != nil || dry.Plan.Rows != coveredRows || r.count(t, `SELECT count(*) FROM outbox`) != total {
		t.Fatalf("dry run: %+v %v (want %d rows, nothing deleted)", dry, err, coveredRows)
	}
	done, err := cleanup(0, required, false)
	if err != nil {
		t.Fatal(err)
	}
	if done.Deleted != coveredRows || done.Batches < 2 {
		t.Fatalf("deleted %d rows in %d batches, want %d in batches of 13", done.Deleted, done.Batches, coveredRows)
	}
	// Exactly the covered journals' rows went; every later row stayed.
	if n := r.count(t, `SELECT count(*) FROM outbox o JOIN journals j ON j.id = o.journal_id WHERE j.sequence <= $1`, cut); n != 0 {
		t.Fatalf("%d rows of covered journals left", n)
	}
	if n := r.count(t, `SELECT count(*) FROM outbox`); n != total-coveredRows {
		t.Fatalf("%d rows left, want %d", n, total-coveredRows)
	}
	if again, err := cleanup(0, required, false); err != nil || again.Deleted != 0 {
		t.Fatalf("second cleanup: %+v %v", again, err)
	}

	// Reconciliation after cleanup starts above the floor and stays clean
	// (the cleaned events are found in the archive, not reported unknown).
	if _, err := ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: r.ops, Consumers: r.sources()}); !errors.Is(err, ops.ErrArchiveRequired) {
		t.Fatalf("reconcile after cleanup without the archive: %v, want ErrArchiveRequired", err)
	}
	if rep := r.reconcile(t, archive); !rep.Clean || rep.Cut.Floor != cut {
		t.Fatalf("reconcile after cleanup: floor %d (want %d), %+v", rep.Cut.Floor, cut, rep)
	}

	// The cleaned range replays from the archive.
	if _, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink, Spec: ops.ReplaySpec{SequenceTo: cut}}); !errors.Is(err, ops.ErrArchiveRequired) {
		t.Fatalf("replay of a cleaned range without the archive: %v", err)
	}
	res, err = ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Archive: archive, Sink: r.sink, Spec: ops.ReplaySpec{SequenceFrom: 1, SequenceTo: cut}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != int64(events) || res.FromArchive != int64(events) {
		t.Fatalf("replay from the archive: %+v, want %d events", res, events)
	}
	r.waitDuplicates(t, int64(2*events))
	r.assertBalancesMatch(t)
}

// A replay interrupted after some batches resumes after the last ACKed
// one: every event is sent once overall (plus at most the batch in flight).
func TestOpsReplayResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsRig(t)
	events := r.deliver(t, 20)
	failing := &failAfter{sink: r.sink, ok: 3}
	res, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: failing, Name: "resumable", Batch: 4})
	if err == nil || res.Sent != 12 {
		t.Fatalf("interrupted replay: %+v %v, want 12 sent then an error", res, err)
	}
	before := len(r.sink.Records(core.TopicEvents))
	res, err = ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink, Name: "resumable", Batch: 4})
	if err != nil || res.ResumedAfter == 0 || res.Sent != int64(events) {
		t.Fatalf("resumed replay: %+v %v", res, err)
	}
	if sent := len(r.sink.Records(core.TopicEvents)) - before; sent != events-12 {
		t.Fatalf("resume sent %d, want the %d not yet sent", sent, events-12)
	}
	r.waitDuplicates(t, int64(events))
	r.assertBalancesMatch(t)
}

// failAfter ACKs ok batches, then fails every publish (a broker outage in
// the middle of a replay).
type failAfter struct {
	sink core.Sink
	ok   int
}

func (f *failAfter) Publish(ctx context.Context, batch []core.Envelope) error {
	if f.ok == 0 {
		return errors.New("broker unreachable")
	}
	f.ok--
	return f.sink.Publish(ctx, batch)
}

func (f *failAfter) Close() error { return nil }

// After a lost ACK (the relay crashed between the sink's ACK and its
// marker), the rows show as uncertain once the lease expires; a resend
// with the same event IDs is absorbed by the inbox and writes the markers.
func TestOpsResendUncertainAfterLostAck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsRig(t)
	events := r.post(t, 6)
	crashed := r.relay(t, &polling.Hooks{AfterAck: func([]core.Envelope) error { return errors.New("crash after ACK") }})
	select {
	case <-crashed.Stopped():
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not crash")
	}
	r.waitApplied(t, events) // delivered although the ledger has no marker
	unrelayed := relaytest.Unrelayed(t, r.ledger)
	if unrelayed == 0 {
		t.Fatal("the crash left no unmarked row")
	}
	// Negative control: while the dead relay's lease is still valid, the
	// rows are not (yet) uncertain.
	if leaseValid(t, r) {
		_, n, err := r.ops.Uncertain(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if leaseValid(t, r) && n != 0 {
			t.Fatalf("%d rows uncertain while the lease is still valid", n)
		}
	}
	var rows []opsstore.UncertainRow
	wait.For(t, 10*time.Second, "the crashed relay's lease to expire", func() bool {
		var err error
		var n int64
		rows, n, err = r.ops.Uncertain(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		return n == int64(unrelayed)
	})

	if _, err := ops.Resend(ctx, ops.ResendConfig{Ledger: r.ops, Sink: r.sink, EventIDs: []string{"0190c0de-0000-7000-8000-000000000000"}}); !errors.Is(err, ops.ErrUnknownEventIDs) {
		t.Fatalf("resend of an unknown ID: %v", err)
	}
	// Resending only a later revision of an account would overtake its
	// unrelayed predecessor: refused.
	var last opsstore.UncertainRow
	for _, u := range rows {
		if u.Revision > 1 {
			last = u
		}
	}
	if last.ID != 0 {
		if _, err := ops.Resend(ctx, ops.ResendConfig{Ledger: r.ops, Sink: r.sink, EventIDs: []string{last.EventID}}); !errors.Is(err, ops.ErrWouldOvertake) {
			t.Fatalf("resend overtaking a predecessor: %v", err)
		}
	}
	ids := make([]string, len(rows))
	for i, u := range rows {
		ids[i] = u.EventID
	}
	res, err := ops.Resend(ctx, ops.ResendConfig{Ledger: r.ops, Sink: r.sink, EventIDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != len(ids) || res.Marked != len(ids) {
		t.Fatalf("resend: %+v, want %d sent and marked", res, len(ids))
	}
	// Commands among them went to their command topic, which no example
	// consumer reads; every resent event is a repeat for both consumers.
	resentEvents := r.count(t, `SELECT count(*) FROM outbox WHERE event_id = ANY($1::text[]::uuid[]) AND kind = 'event'`, ids)
	r.waitDuplicates(t, resentEvents)
	r.assertBalancesMatch(t)
	if n := relaytest.Unrelayed(t, r.ledger); n != 0 {
		t.Fatalf("%d rows still unmarked", n)
	}
	if _, n, _ := r.ops.Uncertain(ctx, 1); n != 0 {
		t.Fatalf("%d uncertain rows after the resend", n)
	}
	if rep := r.reconcile(t, nil); !rep.Clean {
		t.Fatalf("reconcile after resend: %+v", rep)
	}
}

func leaseValid(t *testing.T, r *opsRig) bool {
	return r.count(t, `SELECT count(*) FROM relay_leases WHERE owner IS NOT NULL AND expires_at > now()`) > 0
}

func refusedWith(err error, reason string) bool {
	return errors.Is(err, ops.ErrCleanupRefused) && strings.Contains(err.Error(), reason)
}

// Negative control of the replay guarantee: the same replay, read by the
// projection without its inbox, applies every event a second time and the
// balances drift from the ledger's, while the inbox-backed projection
// absorbs it.
func TestOpsReplayWithoutInboxDoublesBalances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsRig(t)
	bare := smallConsumerPool(t)
	startOpsConsumers(t, r.sink, bare, consumers.WithoutInbox())
	events := r.deliver(t, 10)
	ledger := r.ledgerBalances(t)
	bareBalances := func() map[string]map[string]*big.Int {
		bs, err := projection.Balances(ctx, bare)
		if err != nil {
			t.Fatal(err)
		}
		return bs
	}
	wait.For(t, opsWait, "the bare projection to match the ledger once", func() bool {
		return fmt.Sprint(nonZero(bareBalances())) == fmt.Sprint(ledger)
	})
	if _, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: r.ops, Sink: r.sink}); err != nil {
		t.Fatal(err)
	}
	doubled := map[string]map[string]*big.Int{}
	for acc, curs := range ledger {
		doubled[acc] = map[string]*big.Int{}
		for cur, v := range curs {
			doubled[acc][cur] = new(big.Int).Mul(v, big.NewInt(2))
		}
	}
	wait.For(t, opsWait, "the bare projection to apply the replay again", func() bool {
		return fmt.Sprint(nonZero(bareBalances())) == fmt.Sprint(doubled)
	})
	r.waitDuplicates(t, int64(events))
	r.assertBalancesMatch(t)
}

func nonZero(bs map[string]map[string]*big.Int) map[string]map[string]*big.Int {
	for acc, curs := range bs {
		for cur, v := range curs {
			if v.Sign() == 0 {
				delete(curs, cur)
			}
		}
		if len(curs) == 0 {
			delete(bs, acc)
		}
	}
	return bs
}
