// CommittedReader reads a topic as a read_committed consumer with Apache
// kafka-clients, the Java client nobody on the project wrote, and checks it
// against the committed events the caller lists: every committed event
// received once, per key in revision order, nothing else received, and
// every record on the partition the Java producer's own partitioner
// (BuiltInPartitioner.partitionForKey: murmur2 of the key) computes for its
// key. With --format cloudevents every record is parsed as a CloudEvent by
// the CloudEvents Java SDK's Kafka binding, whose id, subject and sequence
// must agree with the record's contract headers.
//
//   java -cp "$(cat scripts/kafka/reader/.classpath)" scripts/kafka/reader/CommittedReader.java \
//       --bootstrap HOST:PORT,... --topic T --expect FILE [--format posthorn|cloudevents]
//
// FILE has one committed event a line: event_id TAB key TAB revision. It
// prints one line of counts, "java-reader records=N ...", and a few
// examples of each failure on stderr; it exits 0 when it could read (the
// caller judges the counts), 2 when it could not.

import io.cloudevents.CloudEvent;
import io.cloudevents.kafka.KafkaMessageFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class CommittedReader {
    public static void main(String[] args) throws Exception {
        Map<String, String> opt = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            opt.put(args[i], args[i + 1]);
        }
        String bootstrap = opt.get("--bootstrap"), topic = opt.get("--topic"), expect = opt.get("--expect");
        String format = opt.getOrDefault("--format", "posthorn");
        if (bootstrap == null || topic == null || expect == null) {
            System.err.println("usage: CommittedReader --bootstrap B --topic T --expect FILE [--format posthorn|cloudevents]");
            System.exit(2);
        }
        Map<String, Long> committed = new HashMap<>();
        for (String line : Files.readAllLines(Path.of(expect))) {
            if (line.isBlank()) continue;
            String[] f = line.split("\t");
            committed.put(f[0], Long.parseLong(f[2]));
        }

        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "posthorn-java-reader");
        Map<String, Long> counts = new LinkedHashMap<>();
        for (String k : new String[] {"records", "committed", "distinct", "missing", "repeats", "unknown",
                "out_of_order", "wrong_partition", "cloudevents", "cloudevents_invalid", "partitions"}) {
            counts.put(k, 0L);
        }
        counts.put("committed", (long) committed.size());
        List<String> examples = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<PartitionInfo> infos = c.partitionsFor(topic, Duration.ofSeconds(60));
            int n = infos.size();
            counts.put("partitions", (long) n);
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo pi : infos) tps.add(new TopicPartition(topic, pi.partition()));
            c.assign(tps);
            c.seekToBeginning(tps);
            // For a read_committed consumer the end offsets are the last
            // stable offsets: everything before them is settled.
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(60));
            Set<String> seen = new HashSet<>();
            Map<String, Long> last = new HashMap<>();
            long deadline = System.nanoTime() + Duration.ofMinutes(3).toNanos();
            while (!done(c, tps, end)) {
                if (System.nanoTime() > deadline) {
                    System.err.println("java-reader: did not reach the end offsets " + end + " within 3 minutes");
                    System.exit(2);
                }
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    counts.merge("records", 1L, Long::sum);
                    String key = r.key() == null ? "" : new String(r.key(), StandardCharsets.UTF_8);
                    String id = header(r, "event_id");
                    String revHeader = header(r, "revision");
                    long rev = revHeader.isEmpty() ? -1 : Long.parseLong(revHeader);
                    if (format.equals("cloudevents")) {
                        try {
                            CloudEvent e = KafkaMessageFactory.createReader(r).toEvent();
                            Object seq = e.getExtension("sequence");
                            if (!id.equals(e.getId()) || !key.equals(e.getSubject()) || seq == null || Long.parseLong(seq.toString()) != rev) {
                                throw new IllegalStateException("id " + e.getId() + ", subject " + e.getSubject() + ", sequence " + seq
                                        + " disagree with event_id " + id + ", key " + key + ", revision " + rev);
                            }
                            counts.merge("cloudevents", 1L, Long::sum);
                        } catch (RuntimeException ex) {
                            counts.merge("cloudevents_invalid", 1L, Long::sum);
                            example(examples, "not a valid CloudEvent at " + r.topic() + "/" + r.partition() + "@" + r.offset() + ": " + ex.getMessage());
                        }
                    }
                    if (r.key() == null || r.partition() != BuiltInPartitioner.partitionForKey(r.key(), n)) {
                        counts.merge("wrong_partition", 1L, Long::sum);
                        example(examples, "key " + key + " on partition " + r.partition() + ", the Java partitioner says "
                                + (r.key() == null ? "none (no key)" : BuiltInPartitioner.partitionForKey(r.key(), n)));
                    }
                    if (!seen.add(id)) {
                        counts.merge("repeats", 1L, Long::sum);
                        example(examples, "repeat of " + id + " (" + key + " r" + rev + ")");
                        continue;
                    }
                    if (!committed.containsKey(id)) {
                        counts.merge("unknown", 1L, Long::sum);
                        example(examples, "unknown event " + id);
                    }
                    Long prev = last.get(key);
                    if (prev != null && rev < prev) {
                        counts.merge("out_of_order", 1L, Long::sum);
                        example(examples, key + " r" + rev + " after r" + prev);
                    }
                    last.merge(key, rev, Math::max);
                }
            }
            counts.put("distinct", (long) seen.size());
            long missing = 0;
            for (String id : committed.keySet()) {
                if (!seen.contains(id)) {
                    missing++;
                    example(examples, "missing " + id);
                }
            }
            counts.put("missing", missing);
        }
        StringBuilder out = new StringBuilder("java-reader");
        counts.forEach((k, v) -> out.append(' ').append(k).append('=').append(v));
        System.out.println(out);
        for (String e : examples) System.err.println("java-reader: " + e);
    }

    static boolean done(KafkaConsumer<byte[], byte[]> c, List<TopicPartition> tps, Map<TopicPartition, Long> end) {
        for (TopicPartition tp : tps) {
            if (c.position(tp) < end.get(tp)) return false;
        }
        return true;
    }

    static String header(ConsumerRecord<byte[], byte[]> r, String name) {
        Header h = r.headers().lastHeader(name);
        return h == null ? "" : new String(h.value(), StandardCharsets.UTF_8);
    }

    static void example(List<String> examples, String s) {
        if (examples.size() < 10) examples.add(s);
    }
}
