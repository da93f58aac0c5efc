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
	Ledger Store
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
func Replay(ctx context.Context, cfg ReplayConfig) (ReplayResult, error) {
	var res ReplayResult
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	var limiter *rate.Limiter
	if cfg.Rate > 0 {
		cfg.Batch = max(1, min(cfg.Batch, int(cfg.Rate)))
		limiter = rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Batch)
	}
	spec, err := json.Marshal(cfg.Spec)
	if err != nil {
		return res, err
	}
	after := int64(0)
	progress := ReplayProgress{Name: cfg.Name, Spec: spec}
	if cfg.Name != "" {
		saved, found, err := cfg.Ledger.LoadReplay(ctx, cfg.Name)
		if err != nil {
			return res, err
		}
		if found {
			if !jsonEqual(saved.Spec, spec) {
				return res, fmt.Errorf("%w: %s was %s", ErrReplaySpecChanged, cfg.Name, saved.Spec)
			}
			if saved.Done {
				res.AlreadyDone, res.LastID, res.Sent = true, saved.LastID, saved.Sent
				return res, nil
			}
			after, res.ResumedAfter, progress = saved.LastID, saved.LastID, saved
			res.Sent = saved.Sent
		} else if err := cfg.Ledger.SaveReplay(ctx, progress); err != nil {
			return res, err
		}
	}
	cleaned, err := cfg.Ledger.Cleaned(ctx)
	if err != nil {
		return res, err
	}
	total := int64(-1)
	if after >= cleaned.DeletedThroughID { // countable in the outbox alone
		f := cfg.Spec.filter()
		f.AfterID = after
		if n, err := cfg.Ledger.CountRows(ctx, f); err == nil {
			total = res.Sent + n
		}
	}
	send := func(rows []StoredRow) error {
		if len(rows) == 0 {
			return nil
		}
		batch := make([]core.Envelope, len(rows))
		for i, r := range rows {
			e := r.Envelope
			e.Replay = true
			if cfg.Spec.Topic != "" {
				e.Topic = cfg.Spec.Topic
			}
			batch[i] = e
		}
		if limiter != nil {
			if err := limiter.WaitN(ctx, len(batch)); err != nil {
				return err
			}
		}
		if err := cfg.Sink.Publish(ctx, batch); err != nil {
			return fmt.Errorf("publish replay batch (ids %d..%d): %w", rows[0].ID, rows[len(rows)-1].ID, err)
		}
		res.Sent += int64(len(rows))
		res.LastID = rows[len(rows)-1].ID
		if cfg.Name != "" {
			progress.LastID, progress.Sent = res.LastID, res.Sent
			if err := cfg.Ledger.SaveReplay(context.WithoutCancel(ctx), progress); err != nil {
				return err
			}
		}
		if cfg.Progress != nil {
			cfg.Progress(res.Sent, total)
		}
		return nil
	}

	// Below the cleanup boundary: the archive.
	if after < cleaned.DeletedThroughID {
		if cfg.Archive == nil {
			return res, fmt.Errorf("%w (boundary: outbox id %d)", ErrArchiveRequired, cleaned.DeletedThroughID)
		}
		var pending []StoredRow
		err := ReadArchive(ctx, cfg.Archive, after, cleaned.DeletedThroughID, func(r ArchivedRow) error {
			if !cfg.Spec.matches(r) {
				return nil
			}
			pending = append(pending, r.Stored())
			if len(pending) < cfg.Batch {
				return nil
			}
			err := send(pending)
			res.FromArchive += int64(len(pending))
			pending = pending[:0]
			return err
		})
		if err == nil {
			err = send(pending)
			res.FromArchive += int64(len(pending))
		}
		if err != nil {
			return res, err
		}
		after = cleaned.DeletedThroughID
	}
	// Above it: the outbox.
	f := cfg.Spec.filter()
	for {
		f.AfterID = max(after, res.LastID)
		rows, err := cfg.Ledger.ReadRows(ctx, f, cfg.Batch)
		if err != nil {
			return res, err
		}
		if len(rows) == 0 {
			break
		}
		if err := send(rows); err != nil {
			return res, err
		}
	}
	if cfg.Name != "" {
		progress.LastID, progress.Sent, progress.Done = max(res.LastID, progress.LastID), res.Sent, true
		if err := cfg.Ledger.SaveReplay(ctx, progress); err != nil {
			return res, err
		}
	}
	return res, nil
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
