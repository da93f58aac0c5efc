package ops

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/core"
)

// fakeFailoverStore is a ledger that holds the events in held, the
// revisions in revs, and records plans.
type fakeFailoverStore struct {
	held map[string]bool
	revs map[AggregateKey]int64
	// witnesses is each consumer's coverage witness.
	witnesses map[string]string
}

func (f fakeFailoverStore) History(context.Context) (LedgerHistory, error) {
	return LedgerHistory{Accepted: false, Timeline: 2, AcceptedTimeline: 1}, nil
}

func (f fakeFailoverStore) Inspect(_ context.Context, seen []SeenEvent) (map[string]EventState, error) {
	out := map[string]EventState{}
	for _, e := range seen {
		out[e.EventID] = EventState{Held: f.held[e.EventID]}
	}
	return out, nil
}

func (f fakeFailoverStore) Revisions(_ context.Context, aggs []AggregateKey) (map[AggregateKey]int64, error) {
	return f.revs, nil
}

func (fakeFailoverStore) Sequences(context.Context) (int64, int64, error) { return 50, 20, nil }

func (fakeFailoverStore) Recover(context.Context, RecoveryPlan, string) (RecoveryResult, error) {
	return RecoveryResult{}, nil
}

func (fakeFailoverStore) Backlog(context.Context) (RelayBacklog, error) { return RelayBacklog{}, nil }
func (f fakeFailoverStore) Witnessed(_ context.Context, consumer, witness string) (bool, error) {
	return f.witnesses[consumer] == witness, nil
}

// fakeSource holds evs and hands them two at a time, so that an event and
// what completes it (another source's copy, its journal's other line, its
// aggregate's higher revision) come in different batches.
type fakeSource struct {
	name string
	evs  []SeenEvent
}

func (s fakeSource) SourceName() string { return s.name }

func (s fakeSource) Seen(_ context.Context, each func([]SeenEvent) error) error {
	for batch := range slices.Chunk(s.evs, 2) {
		if err := each(slices.Clone(batch)); err != nil {
			return err
		}
	}
	return nil
}

// markedSource is a fakeSource with a mark: from it, it hands only the
// events after the first since.
type markedSource struct {
	fakeSource
	mark SeenMark
}

func (s markedSource) SeenMark(context.Context) (SeenMark, error) { return s.mark, nil }

func (s markedSource) SeenSince(ctx context.Context, since uint64, each func([]SeenEvent) error) error {
	return fakeSource{s.name, s.evs[since:]}.Seen(ctx, each)
}

// A source is read from its mark only when the ledger holds the mark's
// witness, and whole when it does not, when it has no usable mark, or when
// a whole read is asked for; each source's report says which, and why.
func TestFailoverCheckReadsFromAMarkOnlyWithItsWitness(t *testing.T) {
	evs := []SeenEvent{posted(t, "j1", "a", 1, "1"), posted(t, "j2", "a", 2, "1"), posted(t, "j3", "a", 3, "1")}
	source := func(m SeenMark) SeenSource { return markedSource{fakeSource{"inbox", evs}, m} }
	held := fakeFailoverStore{witnesses: map[string]string{"c": "w1"}}
	for _, tc := range []struct {
		name   string
		source SeenSource
		whole  bool
		read   int
		since  uint64
		why    string
	}{
		{"witnessed", source(SeenMark{Consumer: "c", Since: 2, Witness: "w1"}), false, 1, 2, ""},
		{"another pass's witness", source(SeenMark{Consumer: "c", Since: 2, Witness: "w2"}), false, 3, 0, "witness"},
		{"no usable mark", source(SeenMark{Consumer: "c", Why: "no clean reconciliation pass has recorded a mark"}), false, 3, 0, "no clean"},
		{"a whole read asked for", source(SeenMark{Consumer: "c", Since: 2, Witness: "w1"}), true, 3, 0, "asked"},
		{"no marks", fakeSource{"log", evs}, false, 3, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := FailoverCheck(context.Background(), FailoverConfig{Ledger: held, Sources: []SeenSource{tc.source}, Whole: tc.whole})
			if err != nil {
				t.Fatal(err)
			}
			s := rep.Sources[0]
			if s.Events != tc.read || s.SinceMark != tc.since || !strings.Contains(s.WholeBecause, tc.why) || (tc.why == "") != (s.WholeBecause == "") {
				t.Fatalf("read %d events from mark %d (%q), want %d from %d (%q)", s.Events, s.SinceMark, s.WholeBecause, tc.read, tc.since, tc.why)
			}
			if len(rep.Lost) != tc.read {
				t.Fatalf("lost %d events, want the %d read", len(rep.Lost), tc.read)
			}
		})
	}
}

func posted(t *testing.T, journal, account string, rev int64, delta string) SeenEvent {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	p, err := json.Marshal(core.AccountPosted{EventID: id, JournalID: journal, Account: account, Revision: rev, Currency: "EUR",
		Delta: delta, PostedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return SeenEvent{EventID: id, Kind: "event", Type: core.TypeAccountPosted, AggregateType: core.AggregateAccount,
		AggregateID: account, Revision: rev, JournalID: journal, Payload: p}
}

// The check rebuilds only whole postings: one whose payloads a source kept
// and whose lines balance. It names the others with their reason (no
// payload; a line no source read), moves every aggregate to the highest
// revision seen that no rebuild reaches, and moves the sequences by one
// per lost event and journal plus the margin. An inbox without payloads
// and a source with them merge by event ID.
func TestFailoverCheckRebuildsOnlyWholePostings(t *testing.T) {
	whole := uuid.Must(uuid.NewV7()).String()
	half := uuid.Must(uuid.NewV7()).String()
	w1, w2 := posted(t, whole, "a", 3, "-10"), posted(t, whole, "b", 5, "10")
	h1 := posted(t, half, "a", 4, "-7") // its credit was read by no source
	bare := posted(t, uuid.Must(uuid.NewV7()).String(), "c", 9, "1")
	bare.Payload, bare.JournalID = nil, ""
	held := posted(t, uuid.Must(uuid.NewV7()).String(), "a", 2, "1")
	service := SeenEvent{EventID: uuid.Must(uuid.NewV7()).String(), AggregateType: "orders", AggregateID: "o-1", Revision: 4}

	inbox := []SeenEvent{w1, w2, h1, bare, held, service, {EventID: "not-a-uuid", AggregateType: "account", AggregateID: "x", Revision: 1}}
	for i := range inbox {
		inbox[i].Payload, inbox[i].JournalID = nil, ""
	}
	rep, err := FailoverCheck(context.Background(), FailoverConfig{
		Ledger: fakeFailoverStore{held: map[string]bool{held.EventID: true},
			revs: map[AggregateKey]int64{{"account", "a"}: 2, {"account", "b"}: 4}},
		Sources: []SeenSource{fakeSource{"inbox", inbox}, fakeSource{"log", []SeenEvent{w1, w2, h1}}},
		Margin:  100,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Read != 10 || rep.NotLedger != 1 || len(rep.Lost) != 5 || rep.Clean() {
		t.Fatalf("read %d, not the ledger's %d, lost %d, clean %v", rep.Read, rep.NotLedger, len(rep.Lost), rep.Clean())
	}
	if len(rep.Plan.Rebuild) != 1 || rep.Plan.Rebuild[0].JournalID != whole || len(rep.Plan.Rebuild[0].Lines) != 2 {
		t.Fatalf("rebuild %+v, want the whole journal only", rep.Plan.Rebuild)
	}
	reasons := map[string]string{}
	for _, l := range rep.Lost {
		reasons[l.EventID] = l.Reason
		if l.EventID == w1.EventID && (l.Delta != "-10" || len(l.SeenBy) != 2) {
			t.Errorf("merged event %+v: want the log's amount, seen by both", l)
		}
	}
	for id, want := range map[string]string{h1.EventID: "does not balance", bare.EventID: "no source kept its payload",
		service.EventID: "not a posting's event"} {
		if !strings.Contains(reasons[id], want) {
			t.Errorf("event %s: reason %q, want %q", id, reasons[id], want)
		}
	}
	if len(rep.Plan.Record) != 3 {
		t.Errorf("%d to record, want the 3 not rebuilt", len(rep.Plan.Record))
	}
	moves := map[string]int64{}
	for _, m := range rep.Plan.Moves {
		moves[m.AggregateID] = m.Seen
	}
	if len(moves) != 3 || moves["a"] != 4 || moves["c"] != 9 || moves["o-1"] != 4 {
		t.Errorf("moves %v, want a to 4 (past the rebuild's 3), c to 9, o-1 to 4, and b none (the rebuild reaches 5)", moves)
	}
	// 5 lost events; journals: whole, half, and the unknown ones.
	if rep.Plan.OutboxIDPast != 50+5+100 || rep.Plan.JournalSequencePast <= 20+2+100 {
		t.Errorf("sequences past %d and %d", rep.Plan.OutboxIDPast, rep.Plan.JournalSequencePast)
	}
}

// Each lost posting's idempotency key gets its fate from its events'
// digest: restored with a rebuilt journal, lost with one that cannot be
// rebuilt (with its reason), unknown when no event carries a digest or
// they disagree; a digest only one source kept is merged in; an event an
// earlier recovery recorded plans nothing.
func TestFailoverCheckPlansTheLostPostingsKeys(t *testing.T) {
	digest := func(key string) string { return core.IdempotencyDigest(key, [32]byte{1}) }
	withDigest := func(e SeenEvent, d string) SeenEvent {
		e.Headers = map[string]string{core.HeaderIdempotencyDigest: d, "_watermill_message_uuid": e.EventID}
		return e
	}
	restored, lost, unknown, torn := uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String(),
		uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String()
	r1, r2 := posted(t, restored, "a", 1, "-5"), posted(t, restored, "b", 1, "5")
	l1 := posted(t, lost, "a", 2, "-3") // its credit was read by no source: not rebuilt
	u1, u2 := posted(t, unknown, "c", 1, "-2"), posted(t, unknown, "d", 1, "2")
	t1, t2 := withDigest(posted(t, torn, "e", 1, "-1"), digest("k1")), withDigest(posted(t, torn, "f", 1, "1"), digest("k2"))
	// The sink kept r1's digest, the log r2's; r2 reaches the report
	// through the merge.
	sink := []SeenEvent{withDigest(r1, digest("restored")), withDigest(l1, digest("lost")), t1, t2}
	log := []SeenEvent{r1, withDigest(r2, digest("restored")), l1, u1, u2}
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	rep, err := FailoverCheck(context.Background(), FailoverConfig{Ledger: fakeFailoverStore{},
		Sources: []SeenSource{fakeSource{"sink", sink}, fakeSource{"log", log}}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]LostKey{}
	for _, k := range rep.Plan.Keys {
		keys[k.JournalID] = k
	}
	if k := keys[restored]; len(keys) != 2 || !k.Restored || k.Digest != digest("restored") || k.Reason != "" || k.PostedAt.IsZero() || k.PostedAt.Equal(now) {
		t.Fatalf("keys %+v: want the rebuilt journal's restored under its digest, at its posting's time", keys)
	}
	if k := keys[lost]; k.Restored || k.Digest != digest("lost") || !strings.Contains(k.Reason, "does not balance") {
		t.Fatalf("the lost journal's key %+v: want lost, with the reason it was not rebuilt", k)
	}
	why := map[string]UnknownKey{}
	for _, u := range rep.KeysUnknown {
		why[u.JournalID] = u
	}
	if len(why) != 2 || !strings.Contains(why[unknown].Reason, "no idempotency digest") || !why[unknown].Rebuilt ||
		!strings.Contains(why[torn].Reason, "different idempotency digests") {
		t.Fatalf("unknown keys %+v: want the journal without a digest and the one with two", rep.KeysUnknown)
	}
	if rep.NothingToDo() {
		t.Fatal("a plan with keys to record has nothing to do")
	}
	for _, j := range rep.Plan.Rebuild {
		if j.JournalID != restored {
			continue
		}
		for _, l := range j.Lines {
			if l.Headers[core.HeaderIdempotencyDigest] != digest("restored") {
				t.Fatalf("rebuilt line %+v lacks the digest", l)
			}
		}
	}

	recorded := fakeRecorded{fakeFailoverStore{}, map[string]bool{l1.EventID: true}}
	again, err := FailoverCheck(context.Background(), FailoverConfig{Ledger: recorded, Sources: []SeenSource{fakeSource{"sink", []SeenEvent{withDigest(l1, digest("lost"))}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Plan.Keys) != 0 || len(again.KeysUnknown) != 0 {
		t.Fatalf("an event an earlier recovery recorded plans keys again: %+v %+v", again.Plan.Keys, again.KeysUnknown)
	}
}

// fakeRecorded is a ledger on which an earlier recovery recorded the
// events in recorded as lost.
type fakeRecorded struct {
	fakeFailoverStore
	recorded map[string]bool
}

func (f fakeRecorded) Inspect(_ context.Context, seen []SeenEvent) (map[string]EventState, error) {
	out := map[string]EventState{}
	for _, e := range seen {
		if f.recorded[e.EventID] {
			out[e.EventID] = EventState{Recorded: "recorded earlier"}
		}
	}
	return out, nil
}

// drainingLedger has unrelayed rows until its relay has been asked for
// them `drainAfter` times, and one parked aggregate.
type drainingLedger struct {
	fakeFailoverStore
	asked      *int
	drainAfter int
}

func (d drainingLedger) History(context.Context) (LedgerHistory, error) {
	return LedgerHistory{Accepted: true, Timeline: 2, AcceptedTimeline: 2}, nil
}

func (d drainingLedger) Backlog(context.Context) (RelayBacklog, error) {
	*d.asked++
	b := RelayBacklog{Parked: []core.ParkedAggregate{{AggregateType: "account", AggregateID: "p"}}}
	if *d.asked < d.drainAfter {
		b.Unrelayed, b.OldestSeconds = 7, 3
	}
	return b, nil
}

type parkingSource struct{ fakeSource }

func (parkingSource) Parked(context.Context) ([]ConsumerParked, error) {
	return []ConsumerParked{{Consumer: "c", AggregateType: "account", AggregateID: "q", Reason: "gap"}}, nil
}

// A recovery with nothing to write still reports what is not whole: it
// waits up to Settle for the relay's backlog to drain, then names the
// relay's and the consumers' parked aggregates; with no settle time it
// reports the backlog as it found it.
func TestFailoverRecoverReportsWhatIsNotWhole(t *testing.T) {
	for _, tc := range []struct {
		settle    time.Duration
		unrelayed int64
	}{{5 * time.Second, 0}, {0, 7}} {
		asked := 0
		rep, err := FailoverRecover(context.Background(), FailoverConfig{Ledger: drainingLedger{asked: &asked, drainAfter: 3},
			Sources: []SeenSource{parkingSource{fakeSource{name: "inbox"}}}, Settle: tc.settle}, false)
		if err != nil {
			t.Fatal(err)
		}
		n := rep.Remaining
		if rep.Recovery != nil || n == nil || n.Whole() || n.Unrelayed != tc.unrelayed || len(n.Parked) != 1 || len(n.ConsumerParked) != 1 {
			t.Fatalf("settle %s: recovery %+v, remaining %+v; want nothing written, %d unrelayed, both parks named", tc.settle, rep.Recovery, n, tc.unrelayed)
		}
	}
	if !(NotWhole{}).Whole() {
		t.Fatal("an empty report is not whole")
	}
}
