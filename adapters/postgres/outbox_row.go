package postgres

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/posthorn/posthorn/core"
)

// readColumns are the outbox columns every reader of outbox rows selects,
// in the order outboxScan.dest scans them.
const readColumns = `o.id, o.shard, o.event_id::text, o.kind, o.type, o.topic, o.aggregate_type,
       o.aggregate_id, o.revision, o.journal_id::text, o.headers, o.payload, o.occurred_at, o.ledger_timeline`

// outboxScan is one outbox row as read, before decoding. The relay's batch
// read (ReadBatch), the operator's row reads (OpsStore.ReadRows: resend,
// replay, archive) and the CDC stream all fill one and decode it, so a row
// means the same envelope whichever path read it.
type outboxScan struct {
	core.OutboxRow
	kind      string
	journalID pgtype.Text
	headers   []byte
	// timeline is NULL on rows written before timelines were recorded.
	timeline pgtype.Int4
}

// dest returns the scan targets of readColumns, in order.
func (r *outboxScan) dest() []any {
	e := &r.Envelope
	return []any{&r.ID, &r.Shard, &e.EventID, &r.kind, &e.Type, &e.Topic, &e.AggregateType,
		&e.AggregateID, &e.Revision, &r.journalID, &r.headers, &e.Payload, &e.OccurredAt, &r.timeline}
}

// column returns the scan target of the outbox column name (the CDC
// stream's tuples name their columns), nil for a column no reader uses.
func (r *outboxScan) column(name string) any {
	e := &r.Envelope
	switch name {
	case "id":
		return &r.ID
	case "shard":
		return &r.Shard
	case "event_id":
		return &e.EventID
	case "kind":
		return &r.kind
	case "type":
		return &e.Type
	case "topic":
		return &e.Topic
	case "aggregate_type":
		return &e.AggregateType
	case "aggregate_id":
		return &e.AggregateID
	case "revision":
		return &e.Revision
	case "journal_id":
		return &r.journalID
	case "headers":
		return &r.headers
	case "payload":
		return &e.Payload
	case "occurred_at":
		return &e.OccurredAt
	case "ledger_timeline":
		return &r.timeline
	}
	return nil
}

// decode finishes the row: the kind, the journal (empty for none), the
// headers, and the replay flag they carry.
func (r *outboxScan) decode() (core.OutboxRow, error) {
	e := &r.Envelope
	e.Kind = core.Kind(r.kind)
	e.JournalID = r.journalID.String
	e.LedgerTimeline = r.timeline.Int32
	if len(r.headers) > 0 && string(r.headers) != "{}" {
		if err := json.Unmarshal(r.headers, &e.Headers); err != nil {
			return core.OutboxRow{}, fmt.Errorf("outbox row %d: headers: %w", r.ID, err)
		}
	}
	e.Replay = e.Headers[core.HeaderReplay] == "true"
	return r.OutboxRow, nil
}
