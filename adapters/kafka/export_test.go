package kafka

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/core"
)

// SetStall installs a hook that runs before a transaction's first record
// is sent (stage "send") and before its commit ("commit"): a relay that
// stalls there, as a SIGSTOP or a long pause would stall it.
func (s *ExactlyOnceSink) SetStall(f func(stage string)) { s.stall = f }

// SetNoAbortOnUnknownEnd makes the sink leave a transaction whose end
// failed open (the negative control of the abort at once).
func (s *ExactlyOnceSink) SetNoAbortOnUnknownEnd() { s.noAbortUnknown = true }

// NewLeaderAckControl is the negative control of the broker-kill case on
// a replicated cluster: the sink with the producer settings it must not
// have, acks=1 (the leader alone) and no idempotence, so a record is ACKed
// before any follower has it.
func NewLeaderAckControl(cfg Config) (*Sink, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	opts, err := clientOpts(cfg)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())...)
	if err != nil {
		return nil, err
	}
	s.cl.Close()
	s.cl = cl
	return s, nil
}

// Record is the record the sink builds for e.
func (s *Sink) Record(e core.Envelope) (*kgo.Record, error) { return s.record(e) }

// SetProduceAfterCancel makes Publish hand the producer the rest of its
// batch after its context ended, as it did before (the negative control of
// the order test).
func (s *Sink) SetProduceAfterCancel() { s.produceAfterCancel = true }

// BufferedRecords is how many records the producer holds (buffered or in
// flight).
func (s *Sink) BufferedRecords() int64 { return s.cl.BufferedProduceRecords() }
