package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/posthorn/posthorn/core"
)

// ReplaySpec is the range of a replay. Zero fields do not filter.
type ReplaySpec struct {
	// SequenceFrom and SequenceTo select journals by sequence (inclusive).
	SequenceFrom int64 `json:"sequence_from,omitempty"`
	SequenceTo   int64 `json:"sequence_to,omitempty"`
	// From and To select by occurred_at: From <= t < To.
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
	// Account keeps only that account's events.
	Account string `json:"account,omitempty"`
	// Topic sends everything to this topic instead of the original one.
	Topic string `json:"topic,omitempty"`
	// IncludeCommands replays commands too; without it they are never sent.
	IncludeCommands bool `json:"include_commands,omitempty"`
}

func (s ReplaySpec) filter() RowFilter {
	return RowFilter{SequenceFrom: s.SequenceFrom, SequenceTo: s.SequenceTo, From: s.From, To: s.To,
		Account: s.Account, EventsOnly: !s.IncludeCommands, RelayedOnly: true}
}

// matches applies the spec to an archived row as the SQL filter does.
func (s ReplaySpec) matches(r ArchivedRow) bool {
	switch {
	case !r.Relayed:
		return false
	case !s.IncludeCommands && r.Kind != core.KindEvent:
		return false
	case s.SequenceFrom > 0 && (r.JournalSequence == 0 || r.JournalSequence < s.SequenceFrom):
		return false
	case s.SequenceTo > 0 && (r.JournalSequence == 0 || r.JournalSequence > s.SequenceTo):
		return false
	case !s.From.IsZero() && r.OccurredAt.Before(s.From):
		return false
	case !s.To.IsZero() && !r.OccurredAt.Before(s.To):
		return false
	case s.Account != "" && (r.AggregateType != core.AggregateAccount || r.AggregateID != s.Account):
		return false
	}
	return true
}

// ReplayConfig configures Replay.
type ReplayConfig struct {
	Ledger ReplayStore
	// Archive holds rows already cleaned up from the outbox; required only
	// when the range reaches below the cleanup boundary.
	Archive ArchiveStore
	Sink    core.Sink
	Spec    ReplaySpec
	// Name makes the replay resumable: its position is saved after every
	// ACKed batch and a later run with the same name continues from it.
	Name string
	// Rate limits events per second (0: unlimited).
	Rate float64
	// Batch is the most events per publish (default 500).
	Batch int
	// Progress is called after every ACKed batch with the events sent so
	// far and the total (-1 when unknown).
	Progress func(sent, total int64)
}

// ReplayResult says what Replay sent.
type ReplayResult struct {
	Sent         int64 `json:"sent"`
	FromArchive  int64 `json:"from_archive"`
	LastID       int64 `json:"last_id"`
	ResumedAfter int64 `json:"resumed_after,omitempty"`
	AlreadyDone  bool  `json:"already_done,omitempty"`
}

// Errors of Replay.
var (
	// ErrReplaySpecChanged: a resume names a replay saved with another range.
	ErrReplaySpecChanged = errors.New("a replay with this name was started with another range")
	// ErrArchiveRequired: the range reaches rows already cleaned up.
	ErrArchiveRequired = errors.New("rows of the range were cleaned up from the outbox; the archive is required (archive.dir)")
)

// Replay sends the relayed rows of the spec's range, in outbox id order
// (per account, revision order), with their original event IDs and the
// replay header, to their original topic or Spec.Topic. Rows at or below
// the cleanup boundary are read from the archive, the rest from the outbox.
// Commands are skipped unless Spec.IncludeCommands. With Name, the position
// is saved after each ACKed batch; an interrupted replay resumes there, and
// at worst resends the batch in flight (same event IDs).
//
// The steps: resume a named replay's saved position; count the rows to send
// when the outbox alone holds them; send the rows below the cleanup
// boundary from the archive, then the rest from the outbox, batch by batch
// (send); mark the named replay done.
func Replay(ctx context.Context, cfg ReplayConfig) (ReplayResult, error) {
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	r := &replayer{cfg: cfg, total: -1}
	if cfg.Rate > 0 {
		r.cfg.Batch = max(1, min(cfg.Batch, int(cfg.Rate)))
		r.limiter = rate.NewLimiter(rate.Limit(cfg.Rate), r.cfg.Batch)
	}
	after, done, err := r.resume(ctx)
	if err != nil || done {
		return r.res, err
	}
	cleaned, err := cfg.Ledger.Cleaned(ctx)
	if err != nil {
		return r.res, err
	}
	if after >= cleaned.DeletedThroughID { // countable in the outbox alone
		f := cfg.Spec.filter()
		f.AfterID = after
		if n, err := cfg.Ledger.CountRows(ctx, f); err == nil {
			r.total = r.res.Sent + n
		}
	}
	// Below the cleanup boundary: the archive.
	if after < cleaned.DeletedThroughID {
		if cfg.Archive == nil {
			return r.res, fmt.Errorf("%w (boundary: outbox id %d)", ErrArchiveRequired, cleaned.DeletedThroughID)
		}
		if err := r.fromArchive(ctx, after, cleaned.DeletedThroughID); err != nil {
			return r.res, err
		}
		after = cleaned.DeletedThroughID
	}
	// Above it: the outbox.
	f := cfg.Spec.filter()
	for {
		f.AfterID = max(after, r.res.LastID)
		rows, err := cfg.Ledger.ReadRows(ctx, f, r.cfg.Batch)
		if err != nil {
			return r.res, err
		}
		if len(rows) == 0 {
			break
		}
		if err := r.send(ctx, rows); err != nil {
			return r.res, err
		}
	}
	if cfg.Name != "" {
		r.progress.LastID, r.progress.Sent, r.progress.Done = max(r.res.LastID, r.progress.LastID), r.res.Sent, true
		if err := cfg.Ledger.SaveReplay(ctx, r.progress); err != nil {
			return r.res, err
		}
	}
	return r.res, nil
}

// replayer is one Replay under way.
type replayer struct {
	cfg      ReplayConfig
	limiter  *rate.Limiter
	res      ReplayResult
	progress ReplayProgress
	// total is how many rows the replay sends in all (-1: unknown).
	total int64
}

// resume returns the outbox id after which the replay starts: 0, or for a
// named replay its saved position (a new name's start is saved first).
// done is set when the named replay already finished.
func (r *replayer) resume(ctx context.Context) (after int64, done bool, err error) {
	spec, err := json.Marshal(r.cfg.Spec)
	if err != nil {
		return 0, false, err
	}
	r.progress = ReplayProgress{Name: r.cfg.Name, Spec: spec}
	if r.cfg.Name == "" {
		return 0, false, nil
	}
	saved, found, err := r.cfg.Ledger.LoadReplay(ctx, r.cfg.Name)
	if err != nil {
		return 0, false, err
	}
	if !found {
		return 0, false, r.cfg.Ledger.SaveReplay(ctx, r.progress)
	}
	if !jsonEqual(saved.Spec, spec) {
		return 0, false, fmt.Errorf("%w: %s was %s", ErrReplaySpecChanged, r.cfg.Name, saved.Spec)
	}
	if saved.Done {
		r.res.AlreadyDone, r.res.LastID, r.res.Sent = true, saved.LastID, saved.Sent
		return 0, true, nil
	}
	r.res.ResumedAfter, r.progress, r.res.Sent = saved.LastID, saved, saved.Sent
	return saved.LastID, false, nil
}

// fromArchive sends the archived rows of the spec in (after, through].
func (r *replayer) fromArchive(ctx context.Context, after, through int64) error {
	var pending []StoredRow
	err := ReadArchive(ctx, r.cfg.Archive, after, through, func(a ArchivedRow) error {
		if !r.cfg.Spec.matches(a) {
			return nil
		}
		pending = append(pending, a.Stored())
		if len(pending) < r.cfg.Batch {
			return nil
		}
		err := r.send(ctx, pending)
		r.res.FromArchive += int64(len(pending))
		pending = pending[:0]
		return err
	})
	if err == nil {
		err = r.send(ctx, pending)
		r.res.FromArchive += int64(len(pending))
	}
	return err
}

// send publishes one batch as a replay, waits for the rate, and saves the
// position once it is ACKed.
func (r *replayer) send(ctx context.Context, rows []StoredRow) error {
	if len(rows) == 0 {
		return nil
	}
	batch := make([]core.Envelope, len(rows))
	for i, row := range rows {
		e := row.Envelope
		e.Replay = true
		if r.cfg.Spec.Topic != "" {
			e.Topic = r.cfg.Spec.Topic
		}
		batch[i] = e
	}
	if r.limiter != nil {
		if err := r.limiter.WaitN(ctx, len(batch)); err != nil {
			return err
		}
	}
	if err := r.cfg.Sink.Publish(ctx, batch); err != nil {
		return fmt.Errorf("publish replay batch (ids %d..%d): %w", rows[0].ID, rows[len(rows)-1].ID, err)
	}
	r.res.Sent += int64(len(rows))
	r.res.LastID = rows[len(rows)-1].ID
	if r.cfg.Name != "" {
		r.progress.LastID, r.progress.Sent = r.res.LastID, r.res.Sent
		if err := r.cfg.Ledger.SaveReplay(context.WithoutCancel(ctx), r.progress); err != nil {
			return err
		}
	}
	if r.cfg.Progress != nil {
		r.cfg.Progress(r.res.Sent, r.total)
	}
	return nil
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
