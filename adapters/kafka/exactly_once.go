package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
)

// This file is the exactly-once mode (sink.kafka.exactly_once): each
// shard's records go out in Kafka transactions under a transactional ID of
// their own, and each transaction also writes, to PositionsTopic, the outbox
// ids it holds. Its invariants:
//
//   - One transactional ID per shard (TransactionalID), whoever owns the
//     shard. Fence, which the relay calls before it publishes for a shard
//     it has just leased, initialises the producer ID under that ID; the
//     broker then bumps the epoch, aborts (or finishes) any transaction an
//     earlier owner left open and refuses that owner's commits from then
//     on. A relay that stalled past its lease cannot commit.
//   - A transaction commits the batch's records and its positions record
//     together or neither. The positions record names the batch's outbox
//     ids and those of every earlier committed transaction whose markers
//     the relay has not confirmed, so the newest committed positions record
//     of a shard covers every committed row that may lack its marker.
//   - After fencing, Fence reads that newest record (read_committed) and
//     returns its ids; the relay marks them before it sends anything, so a
//     record committed before a crash, a lost commit response or a takeover
//     is never sent again.
//   - A transaction left open holds back every read_committed reader of
//     the partitions it touched (their last stable offset stops at its
//     first record), committed records of every other shard included. So
//     the sink ends it as soon as it can: a transaction whose records or
//     commit failed, or whose commit's outcome is unknown (a lost
//     response), is aborted at once by reloading the producer ID, which
//     bumps the epoch and aborts whatever is still open under it (kgo's
//     documented retry, as KIP-890 advises); when the brokers cannot be
//     reached then, the shard's next Fence does the same. Unfence tries the
//     abort before it lets the producer go. What nobody fences is aborted
//     by the broker after TransactionTimeout. OpenTransactionAge says how
//     long the oldest transaction this sink cannot show ended has been
//     open (posthorn_relay_open_transaction_age_seconds).
//
// The plain Publish (resend and replay, which send again on purpose) goes
// through the embedded idempotent Sink, outside any transaction.

// PositionsTopic holds, per shard, the outbox ids of the relay's committed
// transactions: one partition per shard (partition = shard), records keyed
// by the shard's transactional ID. Only the newest record of a key is
// read, so the topic is created compacted.
const PositionsTopic = "posthorn.relay.positions"

// TransactionalIDPrefixDefault starts the shards' transactional IDs when
// Config.TransactionalIDPrefix is empty. Relays of one outbox must share it;
// relays of different outboxes on one cluster must not.
const TransactionalIDPrefixDefault = "posthorn-relay"

// TransactionTimeout is the shards' transaction timeout: the broker aborts
// a transaction open longer, if nobody ended or fenced it before. Longer
// than a relay batch takes (the relay cuts a publish at its lease
// deadline, 10 s by default, and a commit at endTimeout), short enough to
// bound what an orphan nobody fences holds back: at most this plus the
// broker's check interval (transaction.abort.timed.out.transaction.
// cleanup.interval.ms, 10 s by default).
const TransactionTimeout = 20 * time.Second

// endTimeout bounds a commit or an abort (EndTxn); abortTimeout the abort
// of a transaction whose outcome is unknown (a producer ID reload).
const (
	endTimeout   = 10 * time.Second
	abortTimeout = 5 * time.Second
)

// positionsPartitioner places a positions record on its shard's partition
// (Record.Partition) and every other record by key.
type positionsPartitioner struct{ data kgo.Partitioner }

func (p positionsPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic == PositionsTopic {
		return kgo.ManualPartitioner().ForTopic(topic)
	}
	return p.data.ForTopic(topic)
}

// positions is a positions record's value.
type positions struct {
	IDs []int64 `json:"ids"`
}

// Header kind of a positions record: a transaction's ids, or the marker
// Fence writes to know where the partition ends.
const (
	headerPositionsKind = "posthorn-positions"
	kindCommitted       = "committed"
	kindFence           = "fence"
)

// ExactlyOnceSink is the Kafka sink in exactly-once mode.
type ExactlyOnceSink struct {
	*Sink
	prefix string
	opts   []kgo.Opt // of the shards' producers
	// readerOpts are those of the positions reader, but for what it reads.
	readerOpts []kgo.Opt

	// topicMu makes the first fences, which run in parallel, create the
	// positions topic once.
	topicMu    sync.Mutex
	topicReady bool
	mu         sync.Mutex
	producers  map[int]*kgo.Client // by shard, between Fence and Unfence
	// open is, per shard, when the transaction this sink began and cannot
	// show ended began; orphans are those of shards given up (Unfence)
	// whose abort failed, until the broker's timeout surely ended them.
	open    map[int]time.Time
	orphans map[int]time.Time

	// stall, set by tests only, runs before a transaction's first record
	// is produced (stage "send") and before its commit ("commit").
	stall func(stage string)
	// noAbortUnknown, set by a negative control only, leaves a
	// transaction whose end failed open, as the sink did before it
	// aborted at once.
	noAbortUnknown bool
}

// NewExactlyOnce returns the exactly-once sink. Like New it connects
// lazily; the positions topic is created at the first Fence.
func NewExactlyOnce(cfg Config) (*ExactlyOnceSink, error) {
	plain, err := New(cfg)
	if err != nil {
		return nil, err
	}
	opts, err := clientOpts(cfg)
	if err != nil {
		plain.Close()
		return nil, err
	}
	sec, err := cfg.Security.kgoOpts()
	if err != nil {
		plain.Close()
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	readerOpts := append(sec,
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("posthorn-relay-positions"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// The fence record is there at once; a fetch that waits for more
		// bytes (5 s by default) would only delay the relay.
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	prefix := cfg.TransactionalIDPrefix
	if prefix == "" {
		prefix = TransactionalIDPrefixDefault
	}
	return &ExactlyOnceSink{Sink: plain, prefix: prefix, opts: opts, readerOpts: readerOpts, producers: map[int]*kgo.Client{},
		open: map[int]time.Time{}, orphans: map[int]time.Time{}}, nil
}

// TransactionalID is shard's transactional ID: the same for every relay
// that owns the shard, which is what lets a new owner fence the old.
func (s *ExactlyOnceSink) TransactionalID(shard int) string {
	return fmt.Sprintf("%s-shard-%02d", s.prefix, shard)
}

// Fence makes this sink shard's only producer and returns the outbox ids
// of the shard's newest committed transaction (see the file comment). A
// producer the sink already had for shard is replaced, which also ends
// whatever transaction it left open.
func (s *ExactlyOnceSink) Fence(ctx context.Context, shard int) ([]int64, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if err := s.ensurePositionsTopic(ctx); err != nil {
		return nil, err
	}
	// The new producer's InitProducerID below aborts whatever the old one
	// left open; no separate abort first.
	s.drop(shard, false)
	// A copy: shards are fenced in parallel, and appending to the shared
	// options could hand one shard another's transactional ID.
	cl, err := kgo.NewClient(append(slices.Clone(s.opts),
		kgo.TransactionalID(s.TransactionalID(shard)),
		kgo.TransactionTimeout(TransactionTimeout),
	)...)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: %w", err)
	}
	// InitProducerID under the shard's transactional ID: from here on, no
	// earlier producer of the shard can commit.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kafka sink: fence shard %d (%s): %w", shard, s.TransactionalID(shard), err)
	}
	// The epoch bump ended whatever this sink (or anyone) left open.
	s.ended(shard)
	ids, err := s.committedPositions(ctx, shard)
	if err != nil {
		cl.Close()
		return nil, err
	}
	s.mu.Lock()
	s.producers[shard] = cl
	s.mu.Unlock()
	return ids, nil
}

// Unfence closes shard's producer, if any (the lease was given back or
// lost). A transaction it may have left open is aborted first (within
// abortTimeout); if that fails, the next owner's Fence or the broker's
// transaction timeout aborts it.
func (s *ExactlyOnceSink) Unfence(shard int) { s.drop(shard, true) }

// drop closes shard's producer; with abort, it first aborts a transaction
// the producer may have left open (Unfence).
func (s *ExactlyOnceSink) drop(shard int, abort bool) {
	s.mu.Lock()
	cl := s.producers[shard]
	delete(s.producers, shard)
	began, open := s.open[shard]
	s.mu.Unlock()
	if cl == nil {
		return
	}
	if open && abort {
		if abortUnknown(cl) == nil {
			s.ended(shard)
		} else {
			s.mu.Lock()
			delete(s.open, shard)
			s.orphans[shard] = began
			s.mu.Unlock()
		}
	}
	cl.Close()
}

// abortUnknown ends cl's transaction, whatever state it is in: an abort,
// or when the last end's outcome is unknown a producer ID reload, which
// bumps the epoch and aborts what is open under it (kgo's TryAbort after
// an unconfirmed end does that).
func abortUnknown(cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), abortTimeout)
	defer cancel()
	return cl.EndTransaction(ctx, kgo.TryAbort)
}

// began records that shard's transaction is open from now on.
func (s *ExactlyOnceSink) began(shard int) {
	s.mu.Lock()
	s.open[shard] = time.Now()
	s.mu.Unlock()
}

// ended records that no transaction of shard is open any more.
func (s *ExactlyOnceSink) ended(shard int) {
	s.mu.Lock()
	delete(s.open, shard)
	delete(s.orphans, shard)
	s.mu.Unlock()
}

// OpenTransactionAge is how long the oldest transaction this sink began
// and cannot show ended has been open: zero when none is. An orphan (its
// shard given up while the abort failed) counts until the broker's
// transaction timeout and check interval have surely aborted it.
func (s *ExactlyOnceSink) OpenTransactionAge() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var oldest time.Duration
	for _, t := range s.open {
		oldest = max(oldest, now.Sub(t))
	}
	for shard, t := range s.orphans {
		if now.Sub(t) > TransactionTimeout+brokerAbortInterval {
			delete(s.orphans, shard)
			continue
		}
		oldest = max(oldest, now.Sub(t))
	}
	return oldest
}

// brokerAbortInterval is Kafka's default
// transaction.abort.timed.out.transaction.cleanup.interval.ms.
const brokerAbortInterval = 10 * time.Second

var openTxnAgeDesc = prometheus.NewDesc("posthorn_relay_open_transaction_age_seconds",
	"Exactly-once: age of the oldest Kafka transaction this relay began and has not seen end (0: none); read_committed readers of its partitions wait behind it.",
	nil, nil)

// Describe and Collect make the sink a prometheus.Collector of
// posthorn_relay_open_transaction_age_seconds.
func (s *ExactlyOnceSink) Describe(ch chan<- *prometheus.Desc) { ch <- openTxnAgeDesc }

// Collect reports OpenTransactionAge.
func (s *ExactlyOnceSink) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(openTxnAgeDesc, prometheus.GaugeValue, s.OpenTransactionAge().Seconds())
}

// PublishShard publishes batch, every record of shard, in one transaction
// that also writes ids (the batch's outbox ids and those still unmarked) as
// the shard's newest positions. It returns nil once the transaction
// committed. Otherwise nothing of the batch is committed, or the outcome
// is unknown: the error fails every record sent (a *core.BatchError, with
// core.Permanent on a record a retry cannot fix), and the caller must Fence
// the shard again before publishing for it.
func (s *ExactlyOnceSink) PublishShard(ctx context.Context, shard int, batch []core.Envelope, ids []int64) error {
	if len(batch) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	cl := s.producers[shard]
	s.mu.Unlock()
	if cl == nil {
		return fmt.Errorf("kafka sink: shard %d is not fenced", shard)
	}
	if len(ids) < len(batch) {
		return fmt.Errorf("kafka sink: shard %d: %d ids for a batch of %d", shard, len(ids), len(batch))
	}
	fails, recs, index := s.records(batch)
	if len(recs) == 0 {
		return fails.Err()
	}
	value, err := json.Marshal(positions{IDs: committedIDs(ids, len(batch), index)})
	if err != nil {
		return err
	}
	recs = append(recs, s.positionsRecord(shard, kindCommitted, value))

	if s.stall != nil {
		s.stall("send")
	}
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("kafka sink: begin transaction: %w", err)
	}
	s.began(shard)
	results := produceAll(ctx, cl, recs)
	var first error
	for _, err := range results {
		if err != nil {
			first = err
			break
		}
	}
	end := kgo.TryCommit
	if first != nil || ctx.Err() != nil {
		end = kgo.TryAbort
	}
	// The end of a transaction must not be cut short by ctx: its outcome
	// would be unknowable (kgo's advice); endTimeout bounds it.
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if end == kgo.TryCommit && s.stall != nil {
		s.stall("commit")
	}
	if err := cl.EndTransaction(endCtx, end); err != nil {
		if first == nil {
			first = err
		}
		// The end's outcome is unknown (a lost response, an unreachable
		// coordinator) or it failed: abort now rather than leave the
		// transaction open in front of every read_committed reader. If
		// the brokers cannot be reached, the shard's next Fence ends it.
		if !s.noAbortUnknown && abortUnknown(cl) == nil {
			s.ended(shard)
		}
	} else {
		s.ended(shard)
	}
	if first == nil && end == kgo.TryCommit {
		return fails.Err()
	}
	if first == nil {
		first = ctx.Err()
	}
	for j, i := range index {
		if err := results[j]; err != nil {
			fails.Fail(i, batch[i], classify(err))
			continue
		}
		// Not wrapped: another record's permanent failure is no reason
		// to park this one.
		fails.Fail(i, batch[i], fmt.Errorf("kafka sink: transaction not committed: %v", first))
	}
	return fails.Err()
}

// committedIDs are the ids a transaction's positions record names: of the
// batch's rows (ids[:n], one per envelope) only those whose records are in
// the transaction (index), then the rows carried from earlier
// transactions (ids[n:]). A record that could not be built (too large),
// or one held back behind it, is not in the transaction: naming it would
// let the next owner's fence mark it relayed though the broker never had
// it.
func committedIDs(ids []int64, n int, index []int) []int64 {
	out := make([]int64, 0, len(index)+len(ids)-n)
	for _, i := range index {
		out = append(out, ids[i])
	}
	return append(out, ids[n:]...)
}

// produceAll produces recs and waits for every result.
func produceAll(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) []error {
	results := make([]error, len(recs))
	var wg sync.WaitGroup
	wg.Add(len(recs))
	for j, r := range recs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			results[j] = err
			wg.Done()
		})
	}
	wg.Wait()
	return results
}

func (s *ExactlyOnceSink) positionsRecord(shard int, kind string, value []byte) *kgo.Record {
	key := s.TransactionalID(shard)
	if kind == kindFence {
		// Its own key, so compaction keeps the newest committed record of
		// the shard beside the newest fence.
		key += "/fence"
	}
	return &kgo.Record{
		Topic: PositionsTopic, Partition: int32(shard), Key: []byte(key), Value: value,
		Headers: []kgo.RecordHeader{{Key: headerPositionsKind, Value: []byte(kind)}},
	}
}

// committedPositions returns the ids of shard's newest committed positions
// record. It first writes a fence record outside any transaction: its
// offset is where the partition ends for this read (every transaction of
// the shard's earlier owners has ended, since Fence came first), and a
// read_committed reader receives it once everything before it is settled.
// The read starts a window before that offset and widens it until it finds
// a committed record or reaches the partition's start.
func (s *ExactlyOnceSink) committedPositions(ctx context.Context, shard int) ([]int64, error) {
	fence, err := s.cl.ProduceSync(ctx, s.positionsRecord(shard, kindFence, []byte("{}"))).First()
	if err != nil {
		return nil, fmt.Errorf("kafka sink: write fence record of shard %d: %w", shard, err)
	}
	key := s.TransactionalID(shard)
	for window := int64(256); ; window *= 8 {
		start := max(0, fence.Offset-window)
		ids, found, err := s.readPositions(ctx, shard, key, start, fence.Offset)
		if err != nil || found || start == 0 {
			return ids, err
		}
	}
}

// readPositions reads shard's partition of the positions topic from start
// through the fence record at end, read_committed, and returns the ids of
// the last committed record of key before end.
func (s *ExactlyOnceSink) readPositions(ctx context.Context, shard int, key string, start, end int64) (ids []int64, found bool, err error) {
	rd, err := kgo.NewClient(append(slices.Clone(s.readerOpts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{PositionsTopic: {int32(shard): kgo.NewOffset().At(start)}}),
	)...)
	if err != nil {
		return nil, false, fmt.Errorf("kafka sink: %w", err)
	}
	defer rd.Close()
	for {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, false, fmt.Errorf("kafka sink: read positions of shard %d: %w", shard, err)
		}
		var done bool
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil && !kerr.IsRetriable(ferr) {
			return nil, false, fmt.Errorf("kafka sink: read positions of shard %d: %w", shard, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if done || r.Offset > end {
				return
			}
			if r.Offset == end {
				done = true
				return
			}
			if string(r.Key) != key || recordKind(r) != kindCommitted {
				return
			}
			var p positions
			if err := json.Unmarshal(r.Value, &p); err != nil {
				ferr = fmt.Errorf("kafka sink: positions record at offset %d of shard %d: %w", r.Offset, shard, err)
				done = true
				return
			}
			ids, found = p.IDs, true
		})
		if done {
			return ids, found, ferr
		}
	}
}

func recordKind(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == headerPositionsKind {
			return string(h.Value)
		}
	}
	return ""
}

// ensurePositionsTopic creates the positions topic (one partition per
// shard, compacted) unless it exists, and refuses one with too few
// partitions.
func (s *ExactlyOnceSink) ensurePositionsTopic(ctx context.Context) error {
	s.topicMu.Lock()
	defer s.topicMu.Unlock()
	if s.topicReady {
		return nil
	}
	adm := kadm.NewClient(s.cl)
	compact := "compact"
	_, err := adm.CreateTopic(ctx, core.Shards, -1, map[string]*string{"cleanup.policy": &compact}, PositionsTopic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafka sink: create topic %s: %w", PositionsTopic, err)
	}
	// A topic just created is not in every broker's metadata at once (a
	// real cluster answers UNKNOWN_TOPIC_OR_PARTITION for a moment).
	var d kadm.TopicDetail
	for {
		details, err := adm.ListTopics(ctx, PositionsTopic)
		if err != nil {
			return fmt.Errorf("kafka sink: describe topic %s: %w", PositionsTopic, err)
		}
		d = details[PositionsTopic]
		if !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka sink: describe topic %s: %w (%w)", PositionsTopic, d.Err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if d.Err != nil {
		return fmt.Errorf("kafka sink: describe topic %s: %w", PositionsTopic, d.Err)
	}
	if n := len(d.Partitions); n < core.Shards {
		return fmt.Errorf("kafka sink: topic %s has %d partitions; exactly-once needs one per shard, %d", PositionsTopic, n, core.Shards)
	}
	s.topicReady = true
	return nil
}

// Close closes the shards' producers and the plain sink.
func (s *ExactlyOnceSink) Close() error {
	s.mu.Lock()
	cls := s.producers
	s.producers = map[int]*kgo.Client{}
	s.mu.Unlock()
	for _, cl := range cls {
		cl.Close()
	}
	return s.Sink.Close()
}
