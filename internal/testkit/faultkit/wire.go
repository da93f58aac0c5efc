package faultkit

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
	"github.com/posthorn/posthorn/internal/testkit/kafkatest"
)

// Wire is what one independent reader of the event topic received, held
// against the committed events in the ledger's outbox: the exactly-once
// check of sink.kafka.exactly_once, which a read_committed reader must pass
// with zero repeats, zero missing, per key in revision order.
type Wire struct {
	Reader  string
	Events  int // committed events of the topic in the outbox
	Records int // records read
	// Missing are committed events the reader did not receive.
	Missing []string
	// Repeats counts records beyond the first of their event ID;
	// Repeated names the first of those events (key, revision, event ID).
	Repeats  int
	Repeated []string
	// Unknown are event IDs received that are no committed event.
	Unknown []string
	// Disorder names first receipts of a revision after a later one of
	// the same key.
	Disorder []string
}

// ExactlyOnce reports whether every committed event arrived once, in
// revision order per key, and nothing else did.
func (w Wire) ExactlyOnce() bool {
	return len(w.Missing) == 0 && w.Repeats == 0 && len(w.Unknown) == 0 && len(w.Disorder) == 0
}

func (w Wire) String() string {
	return fmt.Sprintf("%s: %d committed events, %d records: %d missing %v, %d repeats %v, %d unknown %v, %d out of order %v",
		w.Reader, w.Events, w.Records, len(w.Missing), w.Missing[:min(len(w.Missing), 5)], w.Repeats, w.Repeated,
		len(w.Unknown), w.Unknown[:min(len(w.Unknown), 5)], len(w.Disorder), w.Disorder[:min(len(w.Disorder), 5)])
}

// wireRecord is a record's key, event ID and revision.
type wireRecord struct {
	key, eventID string
	revision     int64
}

// WireKgo reads the event topic with franz-go as a read_committed reader
// and checks it against the outbox.
func (s *System) WireKgo(ctx context.Context) (Wire, error) {
	recs, err := kafkatest.ReadTopic(ctx, s.Brokers, core.TopicEvents, true, 5*time.Second)
	if err != nil {
		return Wire{}, err
	}
	got := make([]wireRecord, 0, len(recs))
	for _, r := range recs {
		rev, _ := strconv.ParseInt(kafkatest.Header(r, core.HeaderRevision), 10, 64)
		got = append(got, wireRecord{key: string(r.Key), eventID: kafkatest.Header(r, core.HeaderEventID), revision: rev})
	}
	return s.wire(ctx, "kgo read_committed", got)
}

// WireKcat reads the event topic with kcat (librdkafka) with
// isolation.level=read_committed and checks it against the outbox.
func (s *System) WireKcat(ctx context.Context) (Wire, error) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		return Wire{}, fmt.Errorf("kcat is not installed (Debian package kcat; .ci/run installs it)")
	}
	out, err := exec.CommandContext(ctx, kcat, "-C", "-b", strings.Join(s.Brokers, ","), "-t", core.TopicEvents, "-o", "beginning", "-e", "-q",
		"-X", "isolation.level=read_committed", "-f", `%k\t%h\n`).Output()
	if err != nil {
		return Wire{}, fmt.Errorf("kcat: %w", err)
	}
	var got []wireRecord
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		key, hs, ok := strings.Cut(line, "\t")
		if !ok {
			return Wire{}, fmt.Errorf("kcat line %q", line)
		}
		r := wireRecord{key: key}
		for _, kv := range strings.Split(hs, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case core.HeaderEventID:
				r.eventID = v
			case core.HeaderRevision:
				r.revision, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		got = append(got, r)
	}
	return s.wire(ctx, "kcat read_committed", got)
}

// wire holds the records a reader received against the outbox's committed
// events of the topic.
func (s *System) wire(ctx context.Context, reader string, got []wireRecord) (Wire, error) {
	rows, err := s.Ledger.Query(ctx, `SELECT event_id::text FROM outbox WHERE topic = $1`, core.TopicEvents)
	if err != nil {
		return Wire{}, fmt.Errorf("committed events: %w", err)
	}
	committed := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return Wire{}, err
		}
		committed[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Wire{}, err
	}
	w := Wire{Reader: reader, Events: len(committed), Records: len(got)}
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, r := range got {
		switch {
		case seen[r.eventID]:
			w.Repeats++
			if len(w.Repeated) < 5 {
				w.Repeated = append(w.Repeated, fmt.Sprintf("%s r%d %s", r.key, r.revision, r.eventID))
			}
			continue
		case !committed[r.eventID]:
			w.Unknown = append(w.Unknown, r.eventID)
		}
		seen[r.eventID] = true
		if prev, ok := last[r.key]; ok && r.revision < prev {
			w.Disorder = append(w.Disorder, fmt.Sprintf("%s r%d after r%d", r.key, r.revision, prev))
		}
		last[r.key] = max(last[r.key], r.revision)
	}
	for id := range committed {
		if !seen[id] {
			w.Missing = append(w.Missing, id)
		}
	}
	slices.Sort(w.Missing)
	return w, nil
}

// JavaWire is the counts the Java reader (scripts/kafka/reader) printed:
// records, committed, distinct, missing, repeats, unknown, out_of_order,
// wrong_partition, cloudevents, cloudevents_invalid, partitions.
type JavaWire map[string]int

func (w JavaWire) String() string {
	keys := slices.Sorted(maps.Keys(w))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, w[k])
	}
	return "java read_committed (kafka-clients): " + strings.Join(parts, " ")
}

// WireJava reads the event topic with the Java reader, Apache
// kafka-clients as a read_committed consumer (with format cloudevents,
// every record parsed by the CloudEvents Java SDK's Kafka binding), which
// checks it against the outbox's committed events and prints its counts.
// Its class path is scripts/kafka/reader/.classpath (scripts/setup-machine
// resolves it with Maven); examples of what it found wrong are in
// java-reader.log in the run's directory.
func (s *System) WireJava(ctx context.Context, format string) (JavaWire, error) {
	root, err := kafkacluster.Root()
	if err != nil {
		return nil, err
	}
	reader := filepath.Join(root, "scripts", "kafka", "reader")
	cp, err := os.ReadFile(filepath.Join(reader, ".classpath"))
	if err != nil {
		return nil, fmt.Errorf("the Java reader's class path: %w (make setup resolves it)", err)
	}
	rows, err := s.Ledger.Query(ctx, `SELECT event_id::text, aggregate_id, revision FROM outbox WHERE topic = $1`, core.TopicEvents)
	if err != nil {
		return nil, fmt.Errorf("committed events: %w", err)
	}
	var expect strings.Builder
	for rows.Next() {
		var id, key string
		var rev int64
		if err := rows.Scan(&id, &key, &rev); err != nil {
			rows.Close()
			return nil, err
		}
		fmt.Fprintf(&expect, "%s\t%s\t%d\n", id, key, rev)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	expectFile := filepath.Join(s.cfg.Dir, "committed-events.tsv")
	if err := os.WriteFile(expectFile, []byte(expect.String()), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(s.cfg.Dir, "java-reader.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, "java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-cp", strings.TrimSpace(string(cp)), filepath.Join(reader, "CommittedReader.java"),
		"--bootstrap", strings.Join(s.Brokers, ","), "--topic", core.TopicEvents, "--expect", expectFile, "--format", cmp.Or(format, "posthorn"))
	cmd.Stderr = logFile
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("java reader: %w (its output: %s; see %s)", err, out, logFile.Name())
	}
	w := JavaWire{}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "java-reader "); ok {
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("java reader printed %q", line)
				}
				w[k] = n
			}
		}
	}
	if _, ok := w["records"]; !ok {
		return nil, fmt.Errorf("java reader printed no counts: %q", out)
	}
	return w, nil
}
