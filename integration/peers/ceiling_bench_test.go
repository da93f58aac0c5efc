package peers_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
)

// ceiling is what the broker itself takes on this node: the same records
// the polling relay stored, produced again from memory by a plain producer,
// acks=all and idempotent, once with franz-go and once with kcat
// (librdkafka).
type ceiling struct {
	records      int
	franz, kcat  float64 // records per second
	kcatHeaders  int     // the headers kcat sent with every record
	bytesPerItem int     // key, value and headers of an average record
	franzCPU     cpuUse  // each part's CPU while franz-go produced
}

// measureCeiling reads the first drainEvents records the polling relay
// stored in core.TopicEvents (keys, values, headers as the relay sent
// them) and produces them again to two fresh topics of the same partitions.
func measureCeiling(b *testing.B, brokers []string) ceiling {
	recs := readRecords(b, brokers, core.TopicEvents, drainEvents)
	c := ceiling{records: len(recs)}
	size := 0
	for _, r := range recs {
		size += len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			size += len(h.Key) + len(h.Value)
		}
	}
	c.bytesPerItem = size / len(recs)
	createTopics(b, brokers, "ceiling.franz", "ceiling.kcat")
	cpu0 := sampleCPU(b)
	c.franz = produceFranz(b, brokers, "ceiling.franz", recs)
	c.franzCPU = cpu0.until(sampleCPU(b))
	c.kcat, c.kcatHeaders = produceKcat(b, brokers, "ceiling.kcat", recs)
	for _, topic := range []string{"ceiling.franz", "ceiling.kcat"} {
		if n := stored(b, brokers, topic); n != int64(len(recs)) {
			b.Fatalf("%s holds %d records, %d were produced", topic, n, len(recs))
		}
	}
	return c
}

// stored is how many records topic holds (the sum of its end offsets).
func stored(b *testing.B, brokers []string, topic string) int64 {
	var n int64
	endOffsets(b, brokers, topic).Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// endOffsets lists the end offsets of topic's partitions.
func endOffsets(b *testing.B, brokers []string, topic string) kadm.ListedOffsets {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), topic)
	if err != nil {
		b.Fatal(err)
	}
	return ends
}

// warmBroker produces n records of about a relay's size, keys and headers
// to a topic of their own before anything is measured: a broker started
// with the full JIT spends its first seconds of load compiling, on the
// same 2 cores, and whichever relay ran first would pay for it.
func warmBroker(b *testing.B, brokers []string, n int) {
	createTopics(b, brokers, "warm-up")
	value := []byte(strings.Repeat("v", 200))
	headers := make([]kgo.RecordHeader, 12)
	for i := range headers {
		headers[i] = kgo.RecordHeader{Key: fmt.Sprintf("header-%d", i), Value: []byte("0123456789")}
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "acc-%d", i%2000), Value: value, Headers: headers, Partition: int32(i % partitions)}
	}
	produceFranz(b, brokers, "warm-up", recs)
}

// readRecords reads n records of topic from its start.
func readRecords(b *testing.B, brokers []string, topic string, n int) []*kgo.Record {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recs := make([]*kgo.Record, 0, n)
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			b.Fatalf("read %d of %d records of %s: %v", len(recs), n, topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if len(recs) < n {
				recs = append(recs, &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Partition: r.Partition})
			}
		})
	}
	return recs
}

// produceFranz produces recs to topic, each to the partition the relay
// chose, and returns records per second from the first produce to the
// last acknowledgement. Linger and batch sizes are franz-go's defaults;
// acks=all and idempotence are its defaults too, and asked for all the
// same.
func produceFranz(b *testing.B, brokers []string, topic string, recs []*kgo.Record) float64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MaxBufferedRecords(len(recs)))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	began := time.Now()
	for _, r := range recs {
		r.Topic = topic
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			if err != nil {
				b.Errorf("franz-go ceiling: %v", err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	return float64(len(recs)) / time.Since(began).Seconds()
}

// produceKcat produces recs with kcat from a file of key<TAB>value lines
// and returns records per second over kcat's run, from its start (a
// librdkafka client starts in milliseconds) to its exit after the last
// acknowledgement. kcat sends the same headers with every record, so it
// sends the first record's; the relay's headers differ per record in
// values only, of about the same size.
func produceKcat(b *testing.B, brokers []string, topic string, recs []*kgo.Record) (float64, int) {
	path := filepath.Join(b.TempDir(), "records")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for _, r := range recs {
		if strings.ContainsAny(string(r.Key)+string(r.Value), "\t\n") {
			b.Fatalf("a record's key or value holds a tab or a newline; kcat's line format cannot carry it: %q", r.Key)
		}
		fmt.Fprintf(w, "%s\t%s\n", r.Key, r.Value)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	args := []string{"-P", "-b", strings.Join(brokers, ","), "-t", topic, "-K", "\t", "-l", path,
		"-X", "acks=all", "-X", "enable.idempotence=true", "-X", "partitioner=murmur2_random"}
	for _, h := range recs[0].Headers {
		args = append(args, "-H", h.Key+"="+string(h.Value))
	}
	began := time.Now()
	if out, err := exec.Command("kcat", args...).CombinedOutput(); err != nil {
		b.Fatalf("kcat: %v\n%s", err, out)
	}
	return float64(len(recs)) / time.Since(began).Seconds(), len(recs[0].Headers)
}
