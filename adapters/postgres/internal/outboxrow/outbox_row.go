// Package outboxrow is one outbox row as every reader reads it: the
// columns selected, the scan targets and the decoding into a core.OutboxRow,
// so a row means the same envelope whichever path read it.
package outboxrow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/posthorn/posthorn/core"
)

// Columns are the outbox columns every reader of outbox rows selects,
// in the order Scan.Dest scans them.
const Columns = `o.id, o.shard, o.event_id::text, o.kind, o.type, o.topic, o.aggregate_type,
       o.aggregate_id, o.revision, o.journal_id::text, o.headers, o.payload, o.occurred_at, o.ledger_timeline`

// Scan is one outbox row as read, before decoding. The relay's batch
// read (ReadBatch), the operator's row reads (opsstore.Store.ReadRows: resend,
// replay, archive) and the CDC stream all fill one and decode it, so a row
// means the same envelope whichever path read it.
type Scan struct {
	core.OutboxRow
	kind      string
	journalID pgtype.Text
	headers   []byte
	// timeline is NULL on rows written before timelines were recorded.
	timeline pgtype.Int4
}

// Dest returns the scan targets of Columns, in order.
func (r *Scan) Dest() []any {
	e := &r.Envelope
	return []any{&r.ID, &r.Shard, &e.EventID, &r.kind, &e.Type, &e.Topic, &e.AggregateType,
		&e.AggregateID, &e.Revision, &r.journalID, &r.headers, &e.Payload, &e.OccurredAt, &r.timeline}
}

// Column returns the scan target of the outbox column name (the CDC
// stream's tuples name their columns), nil for a column no reader uses.
func (r *Scan) Column(name string) any {
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

// Decode finishes the row: the kind, the journal (empty for none), the
// headers, and the replay flag they carry.
func (r *Scan) Decode() (core.OutboxRow, error) {
	e := &r.Envelope
	e.Kind = core.Kind(r.kind)
	e.JournalID = r.journalID.String
	e.LedgerTimeline = r.timeline.Int32
	if len(r.headers) > 0 && string(r.headers) != "{}" {
		h, err := decodeHeaders(r.headers)
		if err != nil {
			return core.OutboxRow{}, fmt.Errorf("outbox row %d: headers: %w", r.ID, err)
		}
		e.Headers = h
	}
	e.Replay = e.Headers[core.HeaderReplay] == "true"
	return r.OutboxRow, nil
}

// contractHeaders are stored in their own columns, not in headers.
var contractHeaders = map[string]bool{
	core.HeaderEventID: true, core.HeaderKind: true, core.HeaderType: true,
	core.HeaderAggregateType: true, core.HeaderAggregateID: true, core.HeaderRevision: true,
	core.HeaderJournalID: true, core.HeaderOccurredAt: true, core.HeaderReplay: true,
	core.HeaderLedgerTimeline: true,
}

// defaultHeader reports a versioning header at its default, which the row
// need not store: Envelope.WireHeaders puts it back on the wire. So the
// ledger's rows (version 1, JSON) cost no byte more for carrying it.
func defaultHeader(k, v string) bool {
	return (k == core.HeaderSchemaVersion && v == "1") || (k == core.HeaderContentType && v == core.ContentTypeJSON)
}

// Stored reports whether the header k: v is kept in the row's headers
// column: neither one of the contract's own columns nor a default.
func Stored(k, v string) bool {
	return !contractHeaders[k] && !defaultHeader(k, v)
}

// MetadataHeaderPrefix prefixes the header of an allow-listed metadata key
// on the wire, so metadata can never pose as a contract header.
const MetadataHeaderPrefix = "meta_"

// LedgerEventHeader reports whether k is a header the ledger's write path
// stores on an account's event: allow-listed metadata, the trace context
// and the idempotency digest. A ledger event rebuilt from what the world
// saw keeps these and nothing else: a record read back from a sink also
// carries what the transport added (Watermill's message UUID, a wire
// format's own headers, the old history's ledger_timeline), which the
// row must not store, or the relay would send it again and a sink refuse
// it for good.
func LedgerEventHeader(k string) bool {
	switch k {
	case "traceparent", "tracestate", core.HeaderIdempotencyDigest:
		return true
	}
	return strings.HasPrefix(k, MetadataHeaderPrefix) && len(k) > len(MetadataHeaderPrefix)
}

// decodeHeaders decodes a headers column: an object of strings. The
// relay decodes one per row it sends, and encoding/json's reflection cost
// a seventh of its CPU; so the text PostgreSQL writes for such a jsonb
// value ({"k": "v", "k2": "v2"}: keys sorted, ": " and ", " between,
// nothing escaped unless a string holds a quote, a backslash or a control
// character) is read directly, and anything else (an escape, another
// layout, a value that is not a string) goes through encoding/json.
func decodeHeaders(b []byte) (map[string]string, error) {
	if h, ok := plainHeaders(b); ok {
		return h, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	return h, nil
}

// plainHeaders reads b if it is PostgreSQL's text of an object of strings
// with no escape in them (valid UTF-8, no control character); ok is false
// otherwise.
func plainHeaders(b []byte) (h map[string]string, ok bool) {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' || !utf8.Valid(b) || bytes.ContainsFunc(b, unicode.IsControl) {
		return nil, false
	}
	h = make(map[string]string, bytes.Count(b, []byte(`": "`)))
	rest := b[1 : len(b)-1]
	for len(rest) > 0 {
		k, after, ok := plainString(rest)
		if !ok || !bytes.HasPrefix(after, []byte(": ")) {
			return nil, false
		}
		v, after, ok := plainString(after[2:])
		if !ok {
			return nil, false
		}
		h[k] = v
		switch {
		case len(after) == 0:
			return h, true
		case bytes.HasPrefix(after, []byte(", ")) && len(after) > 2:
			rest = after[2:]
		default:
			return nil, false
		}
	}
	return h, len(h) > 0
}

// plainString reads a JSON string without escapes at the start of b.
func plainString(b []byte) (s string, rest []byte, ok bool) {
	if len(b) < 2 || b[0] != '"' {
		return "", nil, false
	}
	end := bytes.IndexByte(b[1:], '"')
	if end < 0 || bytes.IndexByte(b[1:end+1], '\\') >= 0 {
		return "", nil, false
	}
	return string(b[1 : end+1]), b[end+2:], true
}
