package kafkagroup

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/internal/promset"
)

// DefaultLagInterval is how often the Kafka offset lag is measured.
const DefaultLagInterval = 5 * time.Second

// lagSubscriber measures a Kafka consumer's offset lag: a member
// puts each record's partition and offset in the message context, and
// groupSubscriber.PartitionOffset reads the partitions' high-water marks. The
// lag of a partition is reported once this instance has received a record
// from it (in a group, other partitions belong to other instances).
type lagSubscriber struct {
	kafka    *groupSubscriber
	consumer string
	gauge    *prometheus.GaugeVec
	interval time.Duration

	mu   sync.Mutex
	next map[string]map[int32]int64 // topic → partition → offset after the last delivered

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func newLagSubscriber(k *groupSubscriber, consumer string, reg prometheus.Registerer, interval time.Duration) (*lagSubscriber, error) {
	if interval <= 0 {
		interval = DefaultLagInterval
	}
	gauge, err := promset.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "posthorn_consumer_offset_lag",
		Help: "Kafka records not yet delivered to the consumer, per partition it reads (high-water mark minus the next offset).",
	}, []string{"consumer", "topic", "partition"}))
	if err != nil {
		return nil, err
	}
	return &lagSubscriber{kafka: k, consumer: consumer, gauge: gauge, interval: interval,
		next: make(map[string]map[int32]int64), stop: make(chan struct{})}, nil
}

// observe records that the record at partition p, offset o of topic has
// been handed to the reader.
func (s *lagSubscriber) observe(topic string, p int32, o int64) {
	s.mu.Lock()
	if s.next[topic] == nil {
		s.next[topic] = make(map[int32]int64)
	}
	if o+1 > s.next[topic][p] {
		s.next[topic][p] = o + 1
	}
	s.mu.Unlock()
}

// Subscribe subscribes and starts measuring the topic's lag until Close. A
// record counts as delivered once the reader has taken it: the member
// reads ahead of its reader (pipelined acknowledgements).
func (s *lagSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.kafka.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer close(out)
		for m := range in {
			// Read before the hand-over: the reader owns m after it and
			// may replace its context.
			p, o, ok := messagePartition(m.Context())
			select {
			case out <- m:
				if ok {
					s.observe(topic, p, o)
				}
			case <-ctx.Done():
				return // m stays unacknowledged
			case <-s.stop:
				return
			}
		}
	}()
	go s.measure(ctx, topic)
	return out, nil
}

func (s *lagSubscriber) measure(ctx context.Context, topic string) {
	defer s.wg.Done()
	every(ctx, s.stop, s.interval, func() {
		hwm, err := s.kafka.PartitionOffset(topic)
		if err != nil {
			return // the broker may be restarting; measure next time
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for p, next := range s.next[topic] {
			if h, ok := hwm[p]; ok {
				s.gauge.WithLabelValues(s.consumer, topic, strconv.Itoa(int(p))).Set(float64(max(h-next, 0)))
			}
		}
	})
}

// Close stops measuring and closes the Kafka subscriber.
func (s *lagSubscriber) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	err := s.kafka.Close()
	s.wg.Wait()
	return err
}
