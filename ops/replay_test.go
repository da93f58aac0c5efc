package ops

import (
	"testing"
	"time"

	"github.com/posthorn/posthorn/core"
)

// The archive filter must select what the SQL filter selects: journal
// sequences inclusive, occurred_at [From, To), only relayed rows, commands
// only when asked.
func TestReplaySpecMatchesLikeTheOutboxFilter(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	row := ArchivedRow{Kind: core.KindEvent, AggregateType: core.AggregateAccount, AggregateID: "acc-a",
		JournalSequence: 10, OccurredAt: t0, Relayed: true}
	cmd := row
	cmd.Kind, cmd.AggregateType = core.KindCommand, core.AggregateJournal
	unrelayed := row
	unrelayed.Relayed = false
	noJournal := row
	noJournal.JournalSequence = 0
	for _, c := range []struct {
		name string
		spec ReplaySpec
		row  ArchivedRow
		want bool
	}{
		{"everything", ReplaySpec{}, row, true},
		{"sequence bounds are inclusive", ReplaySpec{SequenceFrom: 10, SequenceTo: 10}, row, true},
		{"below the range", ReplaySpec{SequenceFrom: 11}, row, false},
		{"above the range", ReplaySpec{SequenceTo: 9}, row, false},
		{"no journal with a sequence range", ReplaySpec{SequenceFrom: 1}, noJournal, false},
		{"from is inclusive", ReplaySpec{From: t0}, row, true},
		{"to is exclusive", ReplaySpec{To: t0}, row, false},
		{"other account", ReplaySpec{Account: "acc-b"}, row, false},
		{"the account", ReplaySpec{Account: "acc-a"}, row, true},
		{"command without the flag", ReplaySpec{}, cmd, false},
		{"command with the flag", ReplaySpec{IncludeCommands: true}, cmd, true},
		{"never an unrelayed row", ReplaySpec{IncludeCommands: true}, unrelayed, false},
	} {
		if got := c.spec.matches(c.row); got != c.want {
			t.Errorf("%s: matches = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestJSONEqualIgnoresKeyOrderAndSpace(t *testing.T) {
	if !jsonEqual([]byte(`{"a":1, "b":"x"}`), []byte(`{"b":"x","a":1}`)) {
		t.Error("equal specs compared unequal")
	}
	if jsonEqual([]byte(`{"a":1}`), []byte(`{"a":2}`)) {
		t.Error("different specs compared equal")
	}
}
