package ops

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/core"
)

// Failover check and recovery: what the world has seen against the ledger
// after a failover to a standby that missed the last postings.
//
// Invariants:
//   - An event is in the ledger when the outbox holds its event ID, or,
//     for a posting's event whose journal is known, when that journal holds
//     a line at its account and revision (cleanup may have removed the
//     outbox row); a copy that names no journal is held when the line at
//     its account and revision is one whose outbox row cleanup removed, and
//     a service's event when cleanup removed its aggregate's row at its
//     revision (FailoverStore.Inspect says why that is the copy's event).
//     Each copy a source read is judged on its own, as it comes: the check
//     never needs all sources' copies of an event at once. Every other
//     event a source read is lost.
//   - A source is read from its consumer's reconciliation mark, not whole,
//     only when the ledger holds the witness the mark's pass recorded
//     with the consumer's coverage (sourceMark says why that proves every
//     event below the mark is still held); otherwise, or when asked, it
//     is read whole. Either way the same events are found lost.
//   - A lost posting is rebuilt only from its published events and only
//     whole: every event carries its payload, its revisions are free, and
//     its lines balance per currency. It is re-committed with its journal
//     ID, event IDs and revisions, and its outbox rows are marked relayed:
//     the world has them, so they are never sent as new events.
//   - After a recovery nothing published is reissued: every aggregate's
//     revision is at least the highest any source saw, and the outbox ids
//     and journal sequence move past their last values by one per lost
//     event and journal plus a margin (neither is on the wire, so the old
//     primary's last values are not known).
//   - A lost event that cannot be rebuilt is named with its reason and
//     recorded on the ledger once, so a second recovery has nothing to do.
//   - A lost posting's idempotency key is never lost in silence: its
//     events carry the key's digest (core.HeaderIdempotencyDigest), and a
//     recovery records it with the posting's fate, restored (a retry
//     answers the re-committed journal and writes nothing) or lost (a
//     retry is refused, naming the journal). A journal whose digest no
//     source kept is named, since a retry of its key would post again.
//   - A re-committed event stores only the headers the ledger's write
//     path stores (the store's rule), never what a transport added.
//   - The check and a dry run write nothing. A recovery writes in one
//     transaction, last of all accepting the ledger's new history, so the
//     relay resumes only once nothing can be reissued; it then reports
//     what is still not whole (parked aggregates, unrelayed rows, keys it
//     could not restore).

// SeenEvent is an event the world holds, as a source read it. Fields a
// source does not keep are empty.
type SeenEvent struct {
	EventID       string            `json:"event_id"`
	Kind          string            `json:"kind,omitempty"`
	Type          string            `json:"type,omitempty"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	Revision      int64             `json:"revision"`
	JournalID     string            `json:"journal_id,omitempty"`
	Payload       []byte            `json:"-"`
	Headers       map[string]string `json:"-"`
	SeenBy        []string          `json:"seen_by"`
}

// SeenSource reads what one part of the world (a consumer's inbox, the
// sink) holds.
type SeenSource interface {
	SourceName() string
	// Seen hands each every event the source holds, SeenBatch or fewer at
	// a time, and stops at the first error each returns (returning it
	// unchanged). The check keeps whole only the events the ledger lacks,
	// so its memory is bounded by a batch and the lost events, however
	// long the history the sources hold.
	Seen(ctx context.Context, each func([]SeenEvent) error) error
}

// MarkedSource is a source that can hand only what its consumer changed at
// or after the mark of its last clean reconciliation pass. Every event it
// recorded before the mark was proven known to the ledger by that pass (or
// an earlier one); whether the ledger the check reads still has them is for
// the check to prove, by the mark's witness.
type MarkedSource interface {
	SeenSource
	// SeenMark returns the source's mark with its witness, or why there is
	// none it may read from (Since 0).
	SeenMark(ctx context.Context) (SeenMark, error)
	// SeenSince is Seen for what changed at or after since; an event
	// changed again while it reads may come twice.
	SeenSince(ctx context.Context, since uint64, each func([]SeenEvent) error) error
}

// SeenMark is where a MarkedSource may start.
type SeenMark struct {
	// Consumer names the consumer whose coverage holds Witness.
	Consumer string
	// Since is the mark (0: none may be used, for the reason in Why).
	Since   uint64
	Witness string
	Why     string
}

// SeenBatch is the most events a source hands the check at once.
const SeenBatch = 5000

// LedgerHistory is the ledger server's history and the one accepted last.
type LedgerHistory = core.LedgerHistory

// EventState is what the ledger knows of one seen event.
type EventState struct {
	// Held: the ledger has the event.
	Held bool
	// TakenBy is the journal (or "outbox") that holds the event's
	// aggregate revision instead of it: the revision was reissued.
	TakenBy string
	// Recorded is the reason an earlier recovery recorded it as lost.
	Recorded string
}

// AggregateKey names an aggregate.
type AggregateKey struct{ Type, ID string }

// FailoverStore is the ledger side of the failover check and recovery.
type FailoverStore interface {
	History(ctx context.Context) (LedgerHistory, error)
	// Inspect says, per event ID of seen, what the ledger knows of it.
	Inspect(ctx context.Context, seen []SeenEvent) (map[string]EventState, error)
	// Revisions returns the ledger's revision of each aggregate (0 when it
	// has none).
	Revisions(ctx context.Context, aggs []AggregateKey) (map[AggregateKey]int64, error)
	// Sequences returns the last values of the outbox ids and the journal
	// sequence.
	Sequences(ctx context.Context) (outboxID, journalSequence int64, err error)
	// Recover applies plan in one transaction and accepts the history.
	Recover(ctx context.Context, plan RecoveryPlan, note string) (RecoveryResult, error)
	// Backlog reads the relay's side of what is still not whole: its
	// parked aggregates and the unrelayed rows.
	Backlog(ctx context.Context) (RelayBacklog, error)
	// Witnessed reports whether the ledger holds witness as consumer's
	// coverage witness (Coverage.Witness).
	Witnessed(ctx context.Context, consumer, witness string) (bool, error)
}

// RelayBacklog is the relay's side of the ledger after a recovery.
type RelayBacklog struct {
	Parked []core.ParkedAggregate `json:"relay_parked"`
	// Unrelayed counts the outbox rows no sink has ACKed, the oldest
	// OldestSeconds old.
	Unrelayed     int64   `json:"unrelayed"`
	OldestSeconds float64 `json:"oldest_unrelayed_seconds"`
}

// ParkedSource is a source that also knows the aggregates its consumer
// parked (a consumer's inbox).
type ParkedSource interface {
	SeenSource
	Parked(ctx context.Context) ([]ConsumerParked, error)
}

// ConsumerParked is an aggregate a consumer parked.
type ConsumerParked struct {
	Consumer      string `json:"consumer"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	Reason        string `json:"reason"`
}

// RebuildLine is one line of a lost posting, from its published event.
type RebuildLine struct {
	EventID  string            `json:"event_id"`
	Account  string            `json:"account"`
	Revision int64             `json:"revision"`
	Currency string            `json:"currency"`
	Delta    int64             `json:"delta,string"`
	Payload  json.RawMessage   `json:"payload"`
	Headers  map[string]string `json:"headers"`
}

// RebuildJournal is a lost posting that can be re-committed.
type RebuildJournal struct {
	JournalID string        `json:"journal_id"`
	PostedAt  time.Time     `json:"posted_at"`
	Lines     []RebuildLine `json:"lines"`
}

// LostKey is the idempotency key of a lost posting, known by its digest:
// Restored when the recovery re-commits the posting (a retry answers it),
// otherwise the posting is lost for good and a retry is refused with
// Reason.
type LostKey struct {
	Digest    string    `json:"digest"`
	JournalID string    `json:"journal_id"`
	Restored  bool      `json:"restored"`
	Reason    string    `json:"reason,omitempty"`
	PostedAt  time.Time `json:"posted_at"`
}

// UnknownKey is a lost posting whose idempotency digest no source kept: a
// client's retry of its key cannot be recognised and would post again.
type UnknownKey struct {
	JournalID string `json:"journal_id"`
	Rebuilt   bool   `json:"rebuilt"`
	Reason    string `json:"reason"`
}

// LostEvent is an event the world has and the ledger does not.
type LostEvent struct {
	SeenEvent
	Currency string `json:"currency,omitempty"`
	// Delta is the signed amount (credit positive), when a source kept the
	// payload.
	Delta string `json:"delta,omitempty"`
	// Rebuild: the recovery re-commits it; otherwise Reason says why not.
	Rebuild bool   `json:"rebuild"`
	Reason  string `json:"reason,omitempty"`
	// Recorded: an earlier recovery named it already.
	Recorded bool `json:"recorded,omitempty"`
}

// AggregateMove is an aggregate whose ledger revision is below what was
// published.
type AggregateMove struct {
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	Ledger        int64  `json:"ledger_revision"`
	Seen          int64  `json:"seen_revision"`
}

// RecoveryPlan is what a recovery writes.
type RecoveryPlan struct {
	Rebuild []RebuildJournal `json:"rebuild"`
	// OutboxIDPast and JournalSequencePast are the values the sequences
	// move to (their next values come after).
	OutboxIDPast        int64           `json:"outbox_id_past"`
	JournalSequencePast int64           `json:"journal_sequence_past"`
	Moves               []AggregateMove `json:"moves"`
	// Record are the lost events that cannot be rebuilt, to be recorded.
	Record []LostEvent `json:"record"`
	// Keys are the lost postings' idempotency keys, to be recorded.
	Keys []LostKey `json:"keys"`
}

// RecoveryResult is what a recovery wrote.
type RecoveryResult struct {
	Rebuilt          []string `json:"rebuilt_journals"`
	SequencesMoved   int      `json:"sequences_moved"`
	AggregatesMoved  int      `json:"aggregates_moved"`
	Recorded         int      `json:"recorded"`
	KeysRestored     int      `json:"keys_restored"`
	KeysLost         int      `json:"keys_lost"`
	HistoryAccepted  bool     `json:"history_accepted"`
	JournalSequences []int64  `json:"journal_sequences"`
}

// NotWhole is what is still not whole after a recovery, for the operator:
// the relay's parked aggregates and unrelayed rows, the consumers' parked
// aggregates, and the lost postings whose keys a retry cannot be answered
// from (lost for good, or unknown).
type NotWhole struct {
	RelayBacklog
	ConsumerParked []ConsumerParked `json:"consumer_parked"`
	KeysLost       []LostKey        `json:"keys_lost"`
	KeysUnknown    []UnknownKey     `json:"keys_unknown"`
	// NotRebuilt counts the lost events recorded as not rebuildable.
	NotRebuilt int `json:"not_rebuilt"`
}

// Whole reports that nothing is left for the operator.
func (n NotWhole) Whole() bool {
	return len(n.Parked) == 0 && n.Unrelayed == 0 && len(n.ConsumerParked) == 0 && len(n.KeysLost) == 0 &&
		len(n.KeysUnknown) == 0 && n.NotRebuilt == 0
}

// SourceRead is how many events a source gave, and from where.
type SourceRead struct {
	Name   string `json:"name"`
	Events int    `json:"events"`
	// SinceMark is the mark the source was read from (0: whole, for the
	// reason in WholeBecause when the source has marks).
	SinceMark    uint64 `json:"since_mark,omitempty"`
	WholeBecause string `json:"whole_because,omitempty"`
}

// FailoverReport is the check's verdict.
type FailoverReport struct {
	Sources []SourceRead  `json:"sources"`
	History LedgerHistory `json:"history"`
	// Read counts the events read, an event once per source that holds
	// it; NotLedger those read that are no UUID (no ledger event has such
	// an ID).
	Read      int          `json:"read"`
	NotLedger int          `json:"not_ledger_ids"`
	Lost      []LostEvent  `json:"lost"`
	Plan      RecoveryPlan `json:"plan"`
	// KeysUnknown are the lost postings whose idempotency digest no source
	// kept.
	KeysUnknown []UnknownKey `json:"keys_unknown"`
	// Recovery is set by Recover when it wrote.
	Recovery *RecoveryResult `json:"recovery,omitempty"`
	// Remaining is set by FailoverRecover (not a dry run): what is still
	// not whole once it ran.
	Remaining *NotWhole `json:"remaining,omitempty"`
}

// Clean reports that nothing is lost, nothing is to be moved and the
// history is accepted: the relay may publish.
func (r FailoverReport) Clean() bool { return r.History.Accepted && r.NothingToDo() }

// NothingToDo reports that a recovery would write nothing but the
// acceptance of the history.
func (r FailoverReport) NothingToDo() bool {
	return len(r.Plan.Rebuild) == 0 && len(r.Plan.Moves) == 0 && len(r.Plan.Record) == 0 && len(r.Plan.Keys) == 0
}

// FailoverConfig configures FailoverCheck and FailoverRecover.
type FailoverConfig struct {
	Ledger  FailoverStore
	Sources []SeenSource
	// Margin is how far past their last values, beyond one per lost event
	// or journal, the outbox ids and the journal sequence move.
	Margin int64
	// Settle is how long FailoverRecover waits, once the history is
	// accepted, for the relay to send the unrelayed rows before it reports
	// what is still not whole; 0 reports at once.
	Settle time.Duration
	// Now is the clock (time.Now when nil): a lost key's lifetime runs
	// from its posting's time, or from now when no source kept it.
	Now func() time.Time
	// Whole reads every source whole, none from its mark.
	Whole bool
}

// ErrNoSources is returned when no source is configured.
var ErrNoSources = errors.New("no source of published events to read (consumers or sink)")

// FailoverCheck reads every source and the ledger and reports the lost
// events and what a recovery would write. It writes nothing.
func FailoverCheck(ctx context.Context, cfg FailoverConfig) (FailoverReport, error) {
	if len(cfg.Sources) == 0 {
		return FailoverReport{}, ErrNoSources
	}
	if cfg.Margin < 0 {
		return FailoverReport{}, fmt.Errorf("margin: is %d, want 0 or more", cfg.Margin)
	}
	var rep FailoverReport
	var err error
	if rep.History, err = cfg.Ledger.History(ctx); err != nil {
		return rep, err
	}
	c := checker{ledger: cfg.Ledger, lost: map[string]*lostSeen{}, ahead: map[AggregateKey]int64{}, rep: &rep}
	for _, s := range cfg.Sources {
		read := SourceRead{Name: s.SourceName()}
		var ledgerErr error
		take := func(batch []SeenEvent) error {
			read.Events += len(batch)
			ledgerErr = c.take(ctx, s.SourceName(), batch)
			return ledgerErr
		}
		mark, err := sourceMark(ctx, cfg, s)
		if err != nil {
			return rep, fmt.Errorf("read %s: %w", s.SourceName(), err)
		}
		if read.SinceMark, read.WholeBecause = mark.Since, mark.Why; mark.Since > 0 {
			err = s.(MarkedSource).SeenSince(ctx, mark.Since, take)
		} else {
			err = s.Seen(ctx, take)
		}
		switch {
		case ledgerErr != nil:
			return rep, ledgerErr
		case err != nil:
			return rep, fmt.Errorf("read %s: %w", s.SourceName(), err)
		}
		rep.Sources = append(rep.Sources, read)
		rep.Read += read.Events
	}
	for _, id := range c.order {
		l := c.lost[id]
		rep.Lost = append(rep.Lost, lostEvent(l.SeenEvent, l.state))
	}
	slices.SortFunc(rep.Lost, func(a, b LostEvent) int {
		return cmpLost(a, b)
	})
	rep.Plan.Rebuild = planRebuild(rep.Lost)
	for i := range rep.Lost {
		if l := &rep.Lost[i]; !l.Rebuild && !l.Recorded {
			rep.Plan.Record = append(rep.Plan.Record, *l)
		}
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	rep.Plan.Keys, rep.KeysUnknown = planKeys(rep.Lost, now())
	if err := planMoves(ctx, cfg, c.ahead, &rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// sourceMark is the mark s may be read from: its consumer's, when the
// ledger holds the witness of the pass that recorded it. The pass proved
// every event below the mark known to the ledger it ran on, and wrote the
// witness after it read them; WAL is replayed in order, so a promoted
// standby that holds the witness holds all of them, and only events
// changed since can be lost. Since 0, with the reason, means whole.
func sourceMark(ctx context.Context, cfg FailoverConfig, s SeenSource) (SeenMark, error) {
	ms, ok := s.(MarkedSource)
	switch {
	case !ok:
		return SeenMark{}, nil
	case cfg.Whole:
		return SeenMark{Why: "a whole read was asked for"}, nil
	}
	m, err := ms.SeenMark(ctx)
	if err != nil || m.Since == 0 {
		return m, err
	}
	held, err := cfg.Ledger.Witnessed(ctx, m.Consumer, m.Witness)
	if err != nil {
		return m, err
	}
	if !held {
		return SeenMark{Why: "the ledger does not hold the witness of the pass that recorded the mark (lost with the failover, or the coverage and the mark were recorded by different passes)"}, nil
	}
	return m, nil
}

// checker compares the sources' batches with the ledger as they come.
type checker struct {
	ledger FailoverStore
	// lost holds whole, merged across sources, every event the ledger
	// lacks, in the order first read.
	lost  map[string]*lostSeen
	order []string
	// ahead is each aggregate some source saw at a revision above the
	// ledger's, with the highest seen.
	ahead map[AggregateKey]int64
	rep   *FailoverReport
}

type lostSeen struct {
	SeenEvent
	state EventState
}

// take compares one batch of source with the ledger: the events it lacks
// are kept, and the aggregates seen past its revisions.
func (c *checker) take(ctx context.Context, source string, batch []SeenEvent) error {
	events := make([]SeenEvent, 0, len(batch))
	for _, e := range batch {
		if _, err := uuid.Parse(e.EventID); err != nil {
			c.rep.NotLedger++
			continue
		}
		events = append(events, e)
	}
	if len(events) == 0 {
		return nil
	}
	states, err := c.ledger.Inspect(ctx, events)
	if err != nil {
		return err
	}
	top := map[AggregateKey]int64{}
	var keys []AggregateKey
	for _, e := range events {
		if e.AggregateType != core.AggregateJournal && e.AggregateType != "" && e.AggregateID != "" {
			k := AggregateKey{e.AggregateType, e.AggregateID}
			if _, ok := top[k]; !ok {
				keys = append(keys, k)
			}
			top[k] = max(top[k], e.Revision)
		}
		st := states[e.EventID]
		if st.Held {
			continue
		}
		if have, ok := c.lost[e.EventID]; ok {
			merge(&have.SeenEvent, e, source)
			continue
		}
		e.SeenBy = []string{source}
		c.lost[e.EventID] = &lostSeen{SeenEvent: e, state: st}
		c.order = append(c.order, e.EventID)
	}
	have, err := c.ledger.Revisions(ctx, keys)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if top[k] > have[k] {
			c.ahead[k] = max(c.ahead[k], top[k])
		}
	}
	return nil
}

// FailoverRecover runs the check and, unless dryRun, writes its plan and
// accepts the ledger's history in one transaction. A second run finds
// nothing to do and writes nothing (it accepts the history only if it is
// not accepted yet).
func FailoverRecover(ctx context.Context, cfg FailoverConfig, dryRun bool) (FailoverReport, error) {
	rep, err := FailoverCheck(ctx, cfg)
	if err != nil || dryRun {
		return rep, err
	}
	if !rep.Clean() {
		note := fmt.Sprintf("%d lost events: %d journals re-committed, %d recorded as not rebuildable, %d aggregates moved, %d idempotency keys recorded",
			len(rep.Lost), len(rep.Plan.Rebuild), len(rep.Plan.Record), len(rep.Plan.Moves), len(rep.Plan.Keys))
		res, err := cfg.Ledger.Recover(ctx, rep.Plan, note)
		if err != nil {
			return rep, err
		}
		rep.Recovery = &res
	}
	remaining, err := notWhole(ctx, cfg, rep)
	if err != nil {
		return rep, fmt.Errorf("recovered, but could not read what is still not whole: %w", err)
	}
	rep.Remaining = &remaining
	return rep, nil
}

// notWhole reads what is left for the operator once the history is
// accepted: after waiting up to cfg.Settle for the relay to send the
// unrelayed rows, the relay's backlog and parked aggregates, the
// consumers' parked aggregates, and the lost postings whose keys a retry
// cannot be answered from.
func notWhole(ctx context.Context, cfg FailoverConfig, rep FailoverReport) (NotWhole, error) {
	var n NotWhole
	deadline := time.Now().Add(cfg.Settle)
	for {
		b, err := cfg.Ledger.Backlog(ctx)
		if err != nil {
			return n, err
		}
		n.RelayBacklog = b
		if b.Unrelayed == 0 || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(settlePoll):
		}
	}
	for _, s := range cfg.Sources {
		ps, ok := s.(ParkedSource)
		if !ok {
			continue
		}
		parked, err := ps.Parked(ctx)
		if err != nil {
			return n, fmt.Errorf("read %s: %w", s.SourceName(), err)
		}
		n.ConsumerParked = append(n.ConsumerParked, parked...)
	}
	for _, k := range rep.Plan.Keys {
		if !k.Restored {
			n.KeysLost = append(n.KeysLost, k)
		}
	}
	n.KeysUnknown = rep.KeysUnknown
	for _, l := range rep.Lost {
		if !l.Rebuild {
			n.NotRebuilt++
		}
	}
	return n, nil
}

// settlePoll is how often notWhole reads the relay's backlog while it
// waits for it to drain.
const settlePoll = 250 * time.Millisecond

// planKeys gives each lost posting's idempotency key its fate: restored
// when the journal is rebuilt, lost otherwise; a journal whose events
// carry no digest (or disagreeing ones) is unknown. Events an earlier
// recovery recorded are left out: their keys were recorded then.
func planKeys(lost []LostEvent, now time.Time) ([]LostKey, []UnknownKey) {
	type journal struct {
		digests  map[string]bool
		rebuilt  bool
		reason   string
		postedAt time.Time
	}
	byJournal := map[string]*journal{}
	var order []string
	for _, l := range lost {
		if l.Recorded || l.AggregateType != core.AggregateAccount || l.JournalID == "" {
			continue
		}
		j, ok := byJournal[l.JournalID]
		if !ok {
			j = &journal{digests: map[string]bool{}, rebuilt: true}
			byJournal[l.JournalID] = j
			order = append(order, l.JournalID)
		}
		if d := l.Headers[core.HeaderIdempotencyDigest]; d != "" {
			j.digests[d] = true
		}
		if !l.Rebuild {
			j.rebuilt = false
			if j.reason == "" {
				j.reason = l.Reason
			}
		}
		var p core.AccountPosted
		if json.Unmarshal(l.Payload, &p) == nil && !p.PostedAt.IsZero() && j.postedAt.IsZero() {
			j.postedAt = p.PostedAt
		}
	}
	var keys []LostKey
	var unknown []UnknownKey
	for _, id := range order {
		j := byJournal[id]
		if len(j.digests) != 1 {
			why := "its events carry no idempotency digest (posted before events carried one, or no source kept the header): a retry of its key would post it again"
			if len(j.digests) > 1 {
				why = "its events carry different idempotency digests: a retry of its key cannot be recognised and would post it again"
			}
			unknown = append(unknown, UnknownKey{JournalID: id, Rebuilt: j.rebuilt, Reason: why})
			continue
		}
		k := LostKey{JournalID: id, Restored: j.rebuilt, PostedAt: j.postedAt}
		for d := range j.digests {
			k.Digest = d
		}
		if !j.rebuilt {
			k.Reason = cmp.Or(j.reason, "the posting could not be re-committed")
		}
		if k.PostedAt.IsZero() {
			k.PostedAt = now
		}
		keys = append(keys, k)
	}
	return keys, unknown
}

// merge fills what have lacks from e, which another source read.
func merge(have *SeenEvent, e SeenEvent, source string) {
	if !slices.Contains(have.SeenBy, source) {
		have.SeenBy = append(have.SeenBy, source)
	}
	if have.Kind == "" {
		have.Kind = e.Kind
	}
	if have.Type == "" {
		have.Type = e.Type
	}
	if have.JournalID == "" {
		have.JournalID = e.JournalID
	}
	if have.Payload == nil {
		have.Payload = e.Payload
	}
	if have.Headers == nil && e.Headers != nil {
		have.Headers = map[string]string{}
	}
	for k, v := range e.Headers {
		if _, ok := have.Headers[k]; !ok {
			have.Headers[k] = v
		}
	}
}

// lostEvent describes e, which the ledger lacks, from its payload when a
// source kept it.
func lostEvent(e SeenEvent, st EventState) LostEvent {
	l := LostEvent{SeenEvent: e, Recorded: st.Recorded != "", Reason: st.Recorded}
	if e.AggregateType != core.AggregateAccount {
		if !l.Recorded {
			l.Reason = "not a posting's event (a command or a service's event): its writer's transaction was lost with the primary; the aggregate's revision is moved past it"
		}
		return l
	}
	if e.Payload == nil {
		if !l.Recorded {
			l.Reason = "no source kept its payload (amount and journal unknown): read the sink or a consumer that keeps events whole"
		}
		return l
	}
	var p core.AccountPosted
	if err := json.Unmarshal(e.Payload, &p); err != nil || p.EventID != e.EventID || p.Account != e.AggregateID || p.Revision != e.Revision {
		if !l.Recorded {
			l.Reason = "its payload does not decode to its own event ID, account and revision"
		}
		return l
	}
	l.JournalID, l.Currency, l.Delta = p.JournalID, p.Currency, p.Delta
	if st.TakenBy != "" && !l.Recorded {
		l.Reason = fmt.Sprintf("its revision was reissued to %s: a posting committed after the failover holds it", st.TakenBy)
	}
	return l
}

// planRebuild marks the lost events of whole, balanced, unreissued
// journals as rebuilt and returns those journals; every other lost posting
// event gets its reason.
func planRebuild(lost []LostEvent) []RebuildJournal {
	byJournal := map[string][]int{}
	var journals []string
	for i, l := range lost {
		if l.Recorded || l.AggregateType != core.AggregateAccount || l.JournalID == "" {
			continue
		}
		if _, ok := byJournal[l.JournalID]; !ok {
			journals = append(journals, l.JournalID)
		}
		byJournal[l.JournalID] = append(byJournal[l.JournalID], i)
	}
	var out []RebuildJournal
	for _, j := range journals {
		idx := byJournal[j]
		reason := ""
		sums := map[string]int64{}
		rj := RebuildJournal{JournalID: j}
		for _, i := range idx {
			l := lost[i]
			if l.Reason != "" && reason == "" {
				reason = fmt.Sprintf("journal %s: event %s: %s", j, l.EventID, l.Reason)
			}
			d, err := strconv.ParseInt(l.Delta, 10, 64)
			if err != nil || d == 0 {
				reason = fmt.Sprintf("journal %s: event %s has no signed amount", j, l.EventID)
				continue
			}
			sums[l.Currency] += d
			var p core.AccountPosted
			_ = json.Unmarshal(l.Payload, &p) // decoded in lostEvent
			if rj.PostedAt.IsZero() {
				rj.PostedAt = p.PostedAt
			}
			rj.Lines = append(rj.Lines, RebuildLine{EventID: l.EventID, Account: l.AggregateID, Revision: l.Revision,
				Currency: l.Currency, Delta: d, Payload: json.RawMessage(l.Payload), Headers: l.Headers})
		}
		for cur, s := range sums {
			if s != 0 && reason == "" {
				reason = fmt.Sprintf("journal %s does not balance in %s (off by %d): some of its events were read by no source", j, cur, s)
			}
		}
		if reason != "" {
			for _, i := range idx {
				if lost[i].Reason == "" {
					lost[i].Reason = reason
				}
			}
			continue
		}
		// Line order is the posting's entry order; its event IDs are
		// version 7 UUIDs taken in that order.
		slices.SortFunc(rj.Lines, func(a, b RebuildLine) int { return strings.Compare(a.EventID, b.EventID) })
		for _, i := range idx {
			lost[i].Rebuild = true
		}
		out = append(out, rj)
	}
	return out
}

// planMoves sets the sequences' targets and the aggregates to move: those
// seen past the ledger's revision (read again now, as the ledger may have
// moved on while the sources were read) and past what the plan rebuilds.
func planMoves(ctx context.Context, cfg FailoverConfig, ahead map[AggregateKey]int64, rep *FailoverReport) error {
	keys := slices.SortedFunc(maps.Keys(ahead), func(a, b AggregateKey) int { return cmpKeys(a.Type, a.ID, b.Type, b.ID) })
	have, err := cfg.Ledger.Revisions(ctx, keys)
	if err != nil {
		return err
	}
	rebuilt := map[AggregateKey]int64{}
	for _, j := range rep.Plan.Rebuild {
		for _, l := range j.Lines {
			k := AggregateKey{core.AggregateAccount, l.Account}
			rebuilt[k] = max(rebuilt[k], l.Revision)
		}
	}
	for _, k := range keys {
		if ahead[k] > max(have[k], rebuilt[k]) {
			rep.Plan.Moves = append(rep.Plan.Moves, AggregateMove{AggregateType: k.Type, AggregateID: k.ID, Ledger: have[k], Seen: ahead[k]})
		}
	}
	outboxID, journalSeq, err := cfg.Ledger.Sequences(ctx)
	if err != nil {
		return err
	}
	rep.Plan.OutboxIDPast, rep.Plan.JournalSequencePast = outboxID, journalSeq
	newLost, journals := 0, map[string]bool{}
	for _, l := range rep.Lost {
		if !l.Recorded {
			newLost++
			journals[l.JournalID] = true
		}
	}
	if newLost > 0 {
		rep.Plan.OutboxIDPast = outboxID + int64(newLost) + cfg.Margin
		rep.Plan.JournalSequencePast = journalSeq + int64(len(journals)) + cfg.Margin
	}
	return nil
}

func cmpLost(a, b LostEvent) int {
	if c := cmpKeys(a.AggregateType, a.AggregateID, b.AggregateType, b.AggregateID); c != 0 {
		return c
	}
	switch {
	case a.Revision < b.Revision:
		return -1
	case a.Revision > b.Revision:
		return 1
	}
	return strings.Compare(a.EventID, b.EventID)
}

func cmpKeys(at, ai, bt, bi string) int {
	if c := strings.Compare(at, bt); c != 0 {
		return c
	}
	return strings.Compare(ai, bi)
}
