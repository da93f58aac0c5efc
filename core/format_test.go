package core_test

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/posthorn/posthorn/core"
)

func formatEnvelope(kind core.Kind, rev int64) core.Envelope {
	e := core.Envelope{
		EventID: "0190a000-0000-7000-8000-000000000001", Kind: kind, Type: core.TypeAccountPosted,
		Topic: core.TopicEvents, AggregateType: core.AggregateAccount, AggregateID: "acc-1", Revision: rev,
		JournalID: "0190a000-0000-7000-8000-00000000beef", OccurredAt: time.Date(2026, 12, 1, 9, 30, 0, 5, time.FixedZone("CET", 3600)),
		Headers: map[string]string{"meta_channel": "web"}, Payload: []byte(`{}`),
	}
	if kind == core.KindCommand {
		e.Topic, e.AggregateType, e.AggregateID = "commands.payouts", core.AggregateJournal, e.JournalID
	}
	return e
}

// TestWireFormatsAddTheirHeaders: each format adds exactly its documented
// headers to the contract's, routes as documented, and leaves the caller's
// envelope and its headers map untouched.
func TestWireFormatsAddTheirHeaders(t *testing.T) {
	cases := []struct {
		f     core.WireFormat
		kind  core.Kind
		topic string
		adds  map[string]string
	}{
		{core.WireFormat{Format: core.FormatPosthorn}, core.KindEvent, core.TopicEvents, nil},
		{core.WireFormat{Format: core.FormatCloudEvents, Source: "urn:bank:ledger"}, core.KindEvent, core.TopicEvents, map[string]string{
			"ce_specversion": "1.0", "ce_id": "0190a000-0000-7000-8000-000000000001", "ce_source": "urn:bank:ledger",
			"ce_type": core.TypeAccountPosted, "ce_time": "2026-12-01T08:30:00.000000005Z", "ce_subject": "acc-1",
			"ce_partitionkey": "acc-1", "ce_sequence": "0000000000000000042", "content-type": "application/json",
		}},
		{core.WireFormat{Format: core.FormatDebeziumOutbox}, core.KindEvent, "outbox.event.account", map[string]string{
			"id": "0190a000-0000-7000-8000-000000000001",
		}},
		// Commands keep their topic: Debezium's router has no commands.
		{core.WireFormat{Format: core.FormatDebeziumOutbox}, core.KindCommand, "commands.payouts", map[string]string{
			"id": "0190a000-0000-7000-8000-000000000001",
		}},
	}
	for _, c := range cases {
		in := formatEnvelope(c.kind, 42)
		before := maps.Clone(in.Headers)
		out := c.f.Apply(in)
		if !maps.Equal(in.Headers, before) || in.Topic != formatEnvelope(c.kind, 42).Topic {
			t.Errorf("%s: Apply changed the caller's envelope: %v, topic %s", c.f.Format, in.Headers, in.Topic)
		}
		if out.Topic != c.topic {
			t.Errorf("%s %s: topic %q, want %q", c.f.Format, c.kind, out.Topic, c.topic)
		}
		want := maps.Clone(before)
		maps.Copy(want, c.adds)
		if !maps.Equal(out.Headers, want) {
			t.Errorf("%s %s: headers %v, want %v", c.f.Format, c.kind, out.Headers, want)
		}
		if got := c.f.Topic(c.kind, in.Topic, in.AggregateType); got != c.topic {
			t.Errorf("%s %s: Topic() %q, want %q as Apply routes", c.f.Format, c.kind, got, c.topic)
		}
	}
}

// TestCloudEventsSequenceOrdersAsAString: ce_sequence sorts as text in
// revision order, up to the largest revision.
func TestCloudEventsSequenceOrdersAsAString(t *testing.T) {
	f := core.WireFormat{Format: core.FormatCloudEvents}
	revs := []int64{1, 2, 9, 10, 99, 100, 12345, 1 << 40, 1<<63 - 1}
	var seqs []string
	for _, r := range revs {
		seqs = append(seqs, f.Apply(formatEnvelope(core.KindEvent, r)).Headers[core.HeaderCESequence])
	}
	if !slices.IsSorted(seqs) {
		t.Fatalf("ce_sequence values do not sort as strings: %v", seqs)
	}
	for i, s := range seqs {
		if n, err := strconv.ParseInt(s, 10, 64); err != nil || n != revs[i] || len(s) != len(seqs[0]) {
			t.Fatalf("ce_sequence %q for revision %d", s, revs[i])
		}
	}
	if got := f.Apply(formatEnvelope(core.KindEvent, 1)).Headers[core.HeaderCESource]; got != core.DefaultCloudEventsSource {
		t.Fatalf("ce_source without a configured source: %q, want %q", got, core.DefaultCloudEventsSource)
	}
}
