package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/brokers"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// documentedHeaders reads docs/sinks.md's table of the headers per wire
// format: for each format, the headers on every record ("yes") and those
// on some ("when"; a name with <…> is a prefix). The test checks the
// records against the document, so the two cannot drift apart.
func documentedHeaders(t *testing.T) (always, sometimes map[core.Format][]string) {
	t.Helper()
	f, err := os.Open("../docs/sinks.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	always, sometimes = map[core.Format][]string{}, map[core.Format][]string{}
	var cols []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		switch {
		case cols == nil && len(cells) > 3 && cells[0] == "header" && cells[1] == string(core.FormatPosthorn):
			cols = cells
		case cols != nil && !strings.HasPrefix(line, "|"):
			return always, sometimes
		case cols != nil && !strings.HasPrefix(line, "|---"):
			name, _, _ := strings.Cut(cells[0], "<")
			for i, c := range cols[1 : len(cols)-1] {
				switch cells[i+1] {
				case "yes":
					always[core.Format(c)] = append(always[core.Format(c)], name)
				case "when":
					sometimes[core.Format(c)] = append(sometimes[core.Format(c)], name)
				}
			}
		}
	}
	if cols == nil {
		t.Fatal("docs/sinks.md has no table of the headers per wire format")
	}
	return always, sometimes
}

// TestWireFormatsReadByKcat, per wire format: postings through the
// ledger's write path → relay → kfake. kcat reads every record back and
// each carries exactly the headers docs/sinks.md lists for its format, on
// the format's topic, keyed by the account, per account in revision order.
// Every cloudevents record parses as a valid CloudEvent with the CloudEvents
// Go SDK's Kafka binding (the relay runs in exactly-once mode there, so the
// format is proven through the fenced transactions too). Both example
// consumers, reading the format's topic, apply every event once and the
// projection's balances equal the ledger's. Every payload matches the JSON
// Schema of its type and schema_version (docs/schemas).
func TestWireFormatsReadByKcat(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (Debian package kcat; .ci/run installs it)")
	}
	always, sometimes := documentedHeaders(t)
	for _, format := range core.Formats {
		t.Run(string(format), func(t *testing.T) {
			t.Parallel()
			if len(always[format]) < 9 {
				t.Fatalf("docs/sinks.md lists %d headers on every %s record: %v", len(always[format]), format, always[format])
			}
			wf := core.WireFormat{Format: format, Source: "urn:posthorn:test:" + string(format)}
			topic := wf.Topic(core.KindEvent, core.TopicEvents, core.AggregateAccount)
			_, pool := pgtest.Ledger(t)
			_, consumerPool := pgtest.Consumer(t)
			b := startRelayBroker(t)
			postTransfers(t, pool, "fmt", 40, 7)
			events := countEvents(t, pool)
			exactlyOnce := format == core.FormatCloudEvents
			var sink core.Sink
			if exactlyOnce {
				sink = newExactlyOnceSink(t, b.addrs)
			} else {
				sink = newKafkaSink(t, b.addrs)
			}
			startTestRelay(t, pool, relay.Formatted(sink, wf), "relay-"+string(format), "kafka")
			wait.For(t, 30*time.Second, "the outbox drained", func() bool { return relaytest.Unrelayed(t, pool) == 0 })

			recs := kafkatest.MustReadTopic(t, b.addrs, topic, exactlyOnce)
			if len(recs) < events {
				t.Fatalf("%d records on %s, want the %d events", len(recs), topic, events)
			}
			args := []string{"-C", "-b", b.addrs[0], "-t", topic, "-o", "beginning", "-e", "-q", "-f", `%k\t%h\t%s\n`}
			if exactlyOnce {
				args = append(args, "-X", "isolation.level=read_committed")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, kcat, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("kcat: %v\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != len(recs) {
				t.Fatalf("kcat read %d records, franz-go %d", len(lines), len(recs))
			}
			for _, line := range lines {
				checkKcatRecord(t, wf, line, always[format], sometimes[format])
			}
			if format == core.FormatCloudEvents {
				checkCloudEvents(t, wf, recs)
			}
			checkPayloadSchemas(t, recs)
			if exactlyOnce && len(recs) != events {
				t.Fatalf("exactly-once: %d records for %d events", len(recs), events)
			}
			applyWithExampleConsumers(t, b.addrs, topic, pool, consumerPool, events)
		})
	}
}

// checkKcatRecord checks one kcat line (key, headers, value) of format
// wf: the documented headers are there and no other, and the values the
// format derives agree with the contract headers.
func checkKcatRecord(t *testing.T, wf core.WireFormat, line string, always, sometimes []string) {
	t.Helper()
	f := strings.SplitN(line, "\t", 3)
	if len(f) != 3 {
		t.Fatalf("kcat line %q", line)
	}
	h := kcatHeaders(f[1])
	for _, name := range always {
		if _, ok := h[name]; !ok {
			t.Fatalf("%s record lacks documented header %s: %q", wf.Format, name, line)
		}
	}
	for name := range h {
		documented := false
		for _, d := range always {
			documented = documented || name == d
		}
		for _, d := range sometimes {
			documented = documented || strings.HasPrefix(name, d)
		}
		if !documented {
			t.Fatalf("%s record has header %s, which docs/sinks.md does not list for it: %q", wf.Format, name, line)
		}
	}
	e, err := core.EnvelopeFromHeaders(h, []byte(f[2]))
	if err != nil {
		t.Fatalf("kcat record %q: %v", line, err)
	}
	if f[0] != e.AggregateID || !json.Valid([]byte(f[2])) {
		t.Fatalf("%s record: key %q, aggregate %s, value %q", wf.Format, f[0], e.AggregateID, f[2])
	}
	switch wf.Format {
	case core.FormatCloudEvents:
		if h[core.HeaderCEID] != e.EventID || h[core.HeaderCESubject] != e.AggregateID || h[core.HeaderCEPartitionKey] != f[0] ||
			h[core.HeaderCESource] != wf.Source || h[core.HeaderCEType] != e.Type || h[core.HeaderCESequence] != fmt.Sprintf("%019d", e.Revision) {
			t.Fatalf("cloudevents headers disagree with the contract headers: %q", line)
		}
	case core.FormatDebeziumOutbox:
		if h[core.HeaderDebeziumID] != e.EventID {
			t.Fatalf("debezium id header %q, event %s", h[core.HeaderDebeziumID], e.EventID)
		}
	}
}

// checkCloudEvents parses every record with the CloudEvents SDK's Kafka
// binding: each is a valid CloudEvent in binary mode whose attributes are
// the event's, and per key ce_sequence grows as a string in offset order.
func checkCloudEvents(t *testing.T, wf core.WireFormat, recs []*kgo.Record) {
	t.Helper()
	lastSeq := map[string]string{}
	for _, r := range recs {
		cm := &sarama.ConsumerMessage{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
		for _, h := range r.Headers {
			cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		msg := kafka_sarama.NewMessageFromConsumerMessage(cm)
		if msg.ReadEncoding() != binding.EncodingBinary {
			t.Fatalf("record %s/%d: CloudEvents encoding %v, want binary", r.Topic, r.Offset, msg.ReadEncoding())
		}
		ev, err := binding.ToEvent(context.Background(), msg)
		if err != nil {
			t.Fatalf("record %s/%d: not a CloudEvent: %v", r.Topic, r.Offset, err)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("record %s/%d: invalid CloudEvent: %v", r.Topic, r.Offset, err)
		}
		id := kafkatest.Header(r, core.HeaderEventID)
		occurred, _ := time.Parse(time.RFC3339Nano, kafkatest.Header(r, core.HeaderOccurredAt))
		ext := ev.Extensions()
		if ev.ID() != id || ev.Source() != wf.Source || ev.Type() != core.TypeAccountPosted || ev.Subject() != string(r.Key) ||
			!ev.Time().Equal(occurred) || ev.DataContentType() != core.ContentTypeJSON || string(ev.Data()) != string(r.Value) ||
			ext["partitionkey"] != string(r.Key) {
			t.Fatalf("record %s/%d: CloudEvent %s does not match the record", r.Topic, r.Offset, ev)
		}
		seq, _ := ext["sequence"].(string)
		if seq <= lastSeq[string(r.Key)] {
			t.Fatalf("key %s: ce_sequence %q after %q", r.Key, seq, lastSeq[string(r.Key)])
		}
		lastSeq[string(r.Key)] = seq
	}
}

// applyWithExampleConsumers runs the balance projection and the audit log
// on topic until each has applied all events, and compares the balances.
func applyWithExampleConsumers(t *testing.T, addrs []string, topic string, ledgerPool, pool *pgxpool.Pool, events int) {
	t.Helper()
	sc := brokers.Config{Kind: "kafka"}
	sc.Kafka.Brokers = addrs
	factory, err := brokers.Subscribers(sc, brokers.Options{Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t, pool, 10*time.Second, consumers.Config{Subscribers: factory, Registerer: prometheus.NewRegistry(), HoldTime: time.Minute})
	if err := projection.Register(reg, topic); err != nil {
		t.Fatal(err)
	}
	if err := auditlog.Register(reg, topic); err != nil {
		t.Fatal(err)
	}
	runRegistry(t, reg, t.Logf)
	for _, c := range []string{projection.Name, auditlog.Name} {
		wait.ForStatus(t, time.Minute, c+" to apply every event", func() (bool, string) {
			n := counts(t, pool, c).Events[core.DispositionApplied]
			return n == int64(events), fmt.Sprintf("applied %d of %d", n, events)
		})
	}
	checkBalances(t, ledgerPool, pool)
}

// checkPayloadSchemas validates every record's payload against the JSON
// Schema in docs/schemas named by its type and schema_version header, and
// checks that the schema refuses the same payload without its delta (so a
// pass means something).
func checkPayloadSchemas(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	schemas := map[string]*jsonschema.Schema{}
	for _, r := range recs {
		name := fmt.Sprintf("../docs/schemas/%s.v%s.json", kafkatest.Header(r, core.HeaderType), kafkatest.Header(r, core.HeaderSchemaVersion))
		sch, ok := schemas[name]
		if !ok {
			var err error
			if sch, err = c.Compile(name); err != nil {
				t.Fatalf("record of %s: schema: %v", name, err)
			}
			schemas[name] = sch
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.Value))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(v); err != nil {
			t.Fatalf("record %s/%d does not match %s: %v", r.Topic, r.Offset, name, err)
		}
		if m, ok := v.(map[string]any); ok {
			delete(m, "delta")
			if sch.Validate(m) == nil {
				t.Fatalf("%s accepts a payload without delta", name)
			}
		}
	}
	if len(schemas) == 0 {
		t.Fatal("no record was checked against a schema")
	}
}
