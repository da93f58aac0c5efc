package ops

import (
	"context"
	"encoding/json"
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

type fakeSource struct {
	name string
	evs  []SeenEvent
}

func (s fakeSource) SourceName() string                        { return s.name }
func (s fakeSource) Seen(context.Context) ([]SeenEvent, error) { return s.evs, nil }

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
	if rep.Seen != 6 || rep.NotLedger != 1 || len(rep.Lost) != 5 || rep.Clean() {
		t.Fatalf("seen %d, not the ledger's %d, lost %d, clean %v", rep.Seen, rep.NotLedger, len(rep.Lost), rep.Clean())
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
