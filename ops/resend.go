package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/posthorn/posthorn/core"
)

// Errors of Resend.
var (
	// ErrUnknownEventIDs: an event ID to resend is not in the outbox.
	ErrUnknownEventIDs = errors.New("event IDs not in the outbox")
	// ErrNothingToResend: the id range holds no row.
	ErrNothingToResend = errors.New("no outbox rows to resend")
	// ErrWouldOvertake: a row would be sent ahead of an unrelayed
	// predecessor of its aggregate.
	ErrWouldOvertake = errors.New("resend would overtake an unrelayed predecessor")
)

// ResendConfig configures Resend: either EventIDs or FromID..ToID.
type ResendConfig struct {
	Ledger   ResendStore
	Sink     core.Sink
	EventIDs []string
	// FromID and ToID select outbox ids, inclusive.
	FromID, ToID int64
	// Batch is the most rows per publish (default 500).
	Batch int
}

// ResendResult says what Resend did.
type ResendResult struct {
	Sent     int      `json:"sent"`
	Marked   int      `json:"marked"`
	EventIDs []string `json:"event_ids"`
}

// Resend sends outbox rows again through the sink, exactly as stored: the
// same event IDs, no replay header (it is a retry of the original send),
// with the header resend: true so that broker-side dedup lets it through.
// Unrelayed rows get their marker only after the sink ACKed them. It
// refuses unknown event IDs, an empty range, and an unrelayed row whose
// aggregate has an earlier unrelayed row not in the resend (sending it
// first would break per-account order). Rows go in id order.
//
// The steps: read the selected rows (resendRows); refuse unknown event IDs
// and an empty selection; refuse to overtake an unrelayed predecessor
// (checkOvertake); publish in batches, marking the unrelayed rows of each
// once it is ACKed.
func Resend(ctx context.Context, cfg ResendConfig) (ResendResult, error) {
	var res ResendResult
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	rows, err := resendRows(ctx, cfg)
	if err != nil {
		return res, err
	}
	if err := checkOvertake(ctx, cfg.Ledger, rows); err != nil {
		return res, err
	}
	for start := 0; start < len(rows); start += cfg.Batch {
		chunk := rows[start:min(start+cfg.Batch, len(rows))]
		batch := make([]core.Envelope, len(chunk))
		var unmarked []int64
		for i, r := range chunk {
			batch[i] = resent(r.Envelope)
			if !r.Relayed {
				unmarked = append(unmarked, r.ID)
			}
		}
		if err := cfg.Sink.Publish(ctx, batch); err != nil {
			return res, fmt.Errorf("resend (ids %d..%d): %w", chunk[0].ID, chunk[len(chunk)-1].ID, err)
		}
		res.Sent += len(chunk)
		for _, r := range chunk {
			res.EventIDs = append(res.EventIDs, r.Envelope.EventID)
		}
		if len(unmarked) > 0 {
			n, err := cfg.Ledger.MarkResent(ctx, unmarked)
			if err != nil {
				return res, err
			}
			res.Marked += n
		}
	}
	return res, nil
}

// resendRows reads every row the config selects, in id order: all of its
// event IDs (ErrUnknownEventIDs names those the outbox lacks), or its id
// range (ErrNothingToResend when it holds none).
func resendRows(ctx context.Context, cfg ResendConfig) ([]StoredRow, error) {
	var f RowFilter
	switch {
	case len(cfg.EventIDs) > 0 && (cfg.FromID != 0 || cfg.ToID != 0):
		return nil, errors.New("give event IDs or an id range, not both")
	case len(cfg.EventIDs) > 0:
		f.EventIDs = cfg.EventIDs
	case cfg.FromID > 0 && cfg.ToID >= cfg.FromID:
		f.AfterID, f.ThroughID = cfg.FromID-1, cfg.ToID
	default:
		return nil, errors.New("give event IDs, or an id range with 0 < from <= to")
	}
	var rows []StoredRow
	for {
		batch, err := cfg.Ledger.ReadRows(ctx, f, 10000)
		if err != nil {
			return nil, err
		}
		if len(batch) == 0 {
			break
		}
		rows = append(rows, batch...)
		f.AfterID = batch[len(batch)-1].ID
	}
	if len(cfg.EventIDs) > 0 {
		have := make(map[string]bool, len(rows))
		for _, r := range rows {
			have[r.Envelope.EventID] = true
		}
		var missing []string
		for _, id := range cfg.EventIDs {
			if !have[strings.ToLower(id)] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("%w: %s (cleaned-up rows are resent by posthorn replay from the archive)", ErrUnknownEventIDs, strings.Join(missing, ", "))
		}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: ids %d..%d", ErrNothingToResend, cfg.FromID, cfg.ToID)
	}
	return rows, nil
}

// checkOvertake returns ErrWouldOvertake when an unrelayed row of rows
// follows an unrelayed row of its aggregate that is not being resent.
func checkOvertake(ctx context.Context, ledger ResendStore, rows []StoredRow) error {
	inSet := make(map[int64]bool, len(rows))
	for _, r := range rows {
		inSet[r.ID] = true
	}
	checked := map[core.AggregateKey]bool{}
	for _, r := range rows {
		key := r.Envelope.Aggregate()
		if r.Relayed || checked[key] {
			continue
		}
		checked[key] = true // rows are in id order: the first unrelayed one of each aggregate decides
		p, err := ledger.FirstUnrelayedBefore(ctx, r.Envelope.AggregateType, r.Envelope.AggregateID, r.ID)
		if err != nil {
			return err
		}
		if p != nil && !inSet[p.ID] {
			return fmt.Errorf("%w: event %s (%s %s revision %d) follows unrelayed event %s (revision %d); include it or let the relay send it",
				ErrWouldOvertake, r.Envelope.EventID, r.Envelope.AggregateType, r.Envelope.AggregateID, r.Envelope.Revision, p.EventID, p.Revision)
		}
	}
	return nil
}

// resent marks e as an operator's resend (core.HeaderResend), so that a
// broker's dedup of the first publish does not swallow it.
func resent(e core.Envelope) core.Envelope {
	h := make(map[string]string, len(e.Headers)+1)
	for k, v := range e.Headers {
		h[k] = v
	}
	h[core.HeaderResend] = "true"
	e.Headers = h
	return e
}
