package core

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Kind separates facts (events) from intents (commands): they differ in
// topic naming, handler model and replay rules.
type Kind string

const (
	KindEvent   Kind = "event"
	KindCommand Kind = "command"
)

// Names fixed by the outside contract (contract.md, "Events on the wire").
const (
	// TopicEvents is where every ledger event is published.
	TopicEvents = "ledger.events"
	// CommandTopicPrefix prefixes a command's owning service: commands.<service>.
	CommandTopicPrefix = "commands."
	// TypeAccountPosted is the event written once per journal line.
	TypeAccountPosted = "ledger.account.posted"
	// TypeDeadLettered is the skip marker an operator's dead-letter action
	// puts in place of a record the sink could never take (posthorn outbox
	// dead-letter): the same event ID, aggregate and revision, a small
	// payload naming the dead-lettered type, header dead_lettered_type.
	// Consumers record it as DispositionSkipped and advance past it; the
	// record itself is in the ledger database's dead_letters table.
	TypeDeadLettered = "posthorn.dead_lettered"
	// AggregateAccount is the aggregate type of ledger events.
	AggregateAccount = "account"
	// AggregateJournal is the aggregate type of commands: a command is
	// ordered within the journal that issued it.
	AggregateJournal = "journal"
)

// Wire header names (contract.md).
const (
	HeaderEventID       = "event_id"
	HeaderKind          = "kind"
	HeaderType          = "type"
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
	HeaderRevision      = "revision"
	HeaderJournalID     = "journal_id"
	HeaderOccurredAt    = "occurred_at"
	HeaderReplay        = "replay"
	// HeaderResend is "true" on a record an operator sent again (posthorn
	// outbox resend): a deliberate repeat that a broker's own dedup must
	// not swallow (see Envelope.OperatorRepeat).
	HeaderResend = "resend"
	// HeaderSchemaVersion is the version of the payload's schema for its
	// type (1, 2, …; 1 when a writer set none), so consumers can handle
	// old and new payloads side by side (consumers.Versions).
	HeaderSchemaVersion = "schema_version"
	// HeaderContentType is the payload's media type (ContentTypeJSON when a
	// writer set none).
	HeaderContentType = "content_type"
	// HeaderLedgerTimeline is the timeline of the ledger's history the
	// record's outbox row was written on (Envelope.LedgerTimeline); absent
	// on rows written before timelines were recorded.
	HeaderLedgerTimeline = "ledger_timeline"
	// HeaderIdempotencyDigest is on every ledger event: the posting's
	// IdempotencyDigest, so a ledger failover that loses the posting does
	// not lose what its key answers (posthorn failover recover restores it
	// from the events the world kept). Not the key itself: the digest
	// reveals neither the key nor the request.
	HeaderIdempotencyDigest = "idempotency_digest"
)

// AccountPostedVersion is the schema version of TypeAccountPosted payloads
// the ledger writes (docs/schemas/ledger.account.posted.v1.json).
const AccountPostedVersion = 1

// OperatorRepeat reports whether e is a replay or an operator's resend: a
// repeat of an event ID that must reach the consumer (whose inbox absorbs
// it), so a sink must not give it the broker-side dedup ID of the first
// publish.
func (e Envelope) OperatorRepeat() bool {
	return e.Replay || e.Headers[HeaderResend] == "true"
}

// Envelope is one outbox record as it travels to a sink: identity, routing
// and ordering data in typed fields, the payload opaque.
type Envelope struct {
	EventID       string
	Kind          Kind
	Type          string
	Topic         string
	AggregateType string
	AggregateID   string
	Revision      int64
	JournalID     string
	OccurredAt    time.Time
	// Replay is set on records sent by a historical replay.
	Replay bool
	// SchemaVersion is the payload schema's version; 0 means the one in
	// Headers, else 1.
	SchemaVersion int
	// ContentType is the payload's media type; "" means the one in
	// Headers, else ContentTypeJSON.
	ContentType string
	// Headers are extra headers (allow-listed metadata); they never override
	// the contract headers above.
	Headers map[string]string
	Payload []byte
	// LedgerTimeline is the timeline of the ledger's PostgreSQL history
	// (system identifier and timeline, core.LedgerHistory) its outbox row
	// was written on: a promotion starts a new one. 0 is unknown (a row
	// written before timelines were recorded, or a record without the
	// header).
	LedgerTimeline int32
}

// CommandTopic returns the topic of a command type: its first dot-separated
// segment names the owning service ("payouts.payout.execute" → "commands.payouts").
func CommandTopic(prefix, commandType string) string {
	service, _, _ := strings.Cut(commandType, ".")
	return prefix + service
}

// WireHeaders returns every header the contract requires, plus the extra ones.
func (e Envelope) WireHeaders() map[string]string {
	h := make(map[string]string, len(e.Headers)+11)
	e.EachWireHeader(func(k, v string) { h[k] = v })
	return h
}

// EachWireHeader calls fn with every header of WireHeaders, each key once,
// without building the map: the extra headers first (but those the
// envelope's own fields set), then the contract's.
func (e Envelope) EachWireHeader(fn func(k, v string)) {
	for k, v := range e.Headers {
		if !wireField[k] {
			fn(k, v)
		}
	}
	fn(HeaderEventID, e.EventID)
	fn(HeaderKind, string(e.Kind))
	fn(HeaderType, e.Type)
	fn(HeaderAggregateType, e.AggregateType)
	fn(HeaderAggregateID, e.AggregateID)
	fn(HeaderRevision, strconv.FormatInt(e.Revision, 10))
	fn(HeaderJournalID, e.JournalID)
	fn(HeaderOccurredAt, e.OccurredAt.UTC().Format(time.RFC3339Nano))
	fn(HeaderSchemaVersion, e.version())
	fn(HeaderContentType, e.MediaType())
	if e.Replay {
		fn(HeaderReplay, "true")
	}
	if e.LedgerTimeline > 0 {
		fn(HeaderLedgerTimeline, strconv.FormatInt(int64(e.LedgerTimeline), 10))
	}
}

// wireField are the headers of the envelope's own fields: EachWireHeader
// never takes them from Headers (an extra header of the same name never
// overrides them; replay and ledger_timeline are left out when the field
// is unset), and EnvelopeFromHeaders reads them into the fields.
var wireField = map[string]bool{
	HeaderEventID: true, HeaderKind: true, HeaderType: true, HeaderAggregateType: true, HeaderAggregateID: true,
	HeaderRevision: true, HeaderJournalID: true, HeaderOccurredAt: true, HeaderSchemaVersion: true,
	HeaderContentType: true, HeaderReplay: true, HeaderLedgerTimeline: true,
}

// version is the payload schema's version as a header value: the field's,
// else the one in Headers, else 1.
func (e Envelope) version() string {
	switch {
	case e.SchemaVersion > 0:
		return strconv.Itoa(e.SchemaVersion)
	case e.Headers[HeaderSchemaVersion] != "":
		return e.Headers[HeaderSchemaVersion]
	}
	return "1"
}

// MediaType is the payload's content type: the field's, else the one in
// Headers, else ContentTypeJSON.
func (e Envelope) MediaType() string {
	switch {
	case e.ContentType != "":
		return e.ContentType
	case e.Headers[HeaderContentType] != "":
		return e.Headers[HeaderContentType]
	}
	return ContentTypeJSON
}

// ErrBadEnvelope is returned when a received record lacks or garbles a
// contract header; such a record can never be applied and is rejected.
var ErrBadEnvelope = errors.New("bad envelope")

// EnvelopeFromHeaders rebuilds an envelope from wire headers and payload:
// the contract's headers into their fields, the others into Headers.
// Topic is left empty: the receiver knows which topic it read.
func EnvelopeFromHeaders(h map[string]string, payload []byte) (Envelope, error) {
	e := Envelope{
		EventID:       h[HeaderEventID],
		Kind:          Kind(h[HeaderKind]),
		Type:          h[HeaderType],
		AggregateType: h[HeaderAggregateType],
		AggregateID:   h[HeaderAggregateID],
		JournalID:     h[HeaderJournalID],
		Replay:        h[HeaderReplay] == "true",
		Payload:       payload,
	}
	for _, k := range []string{HeaderEventID, HeaderKind, HeaderType, HeaderAggregateType, HeaderAggregateID, HeaderRevision} {
		if h[k] == "" {
			return Envelope{}, fmt.Errorf("%w: header %q missing", ErrBadEnvelope, k)
		}
	}
	if e.Kind != KindEvent && e.Kind != KindCommand {
		return Envelope{}, fmt.Errorf("%w: header %q is %q, want event or command", ErrBadEnvelope, HeaderKind, e.Kind)
	}
	rev, err := strconv.ParseInt(h[HeaderRevision], 10, 64)
	if err != nil || rev < 1 {
		return Envelope{}, fmt.Errorf("%w: header %q is %q, want a positive integer", ErrBadEnvelope, HeaderRevision, h[HeaderRevision])
	}
	e.Revision = rev
	e.SchemaVersion, e.ContentType = 1, ContentTypeJSON
	if s := h[HeaderSchemaVersion]; s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return Envelope{}, fmt.Errorf("%w: header %q is %q, want a positive integer", ErrBadEnvelope, HeaderSchemaVersion, s)
		}
		e.SchemaVersion = v
	}
	if s := h[HeaderContentType]; s != "" {
		e.ContentType = s
	}
	if s := h[HeaderOccurredAt]; s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return Envelope{}, fmt.Errorf("%w: header %q: %v", ErrBadEnvelope, HeaderOccurredAt, err)
		}
		e.OccurredAt = t
	}
	if s := h[HeaderLedgerTimeline]; s != "" {
		v, err := strconv.ParseInt(s, 10, 32)
		if err != nil || v < 1 {
			return Envelope{}, fmt.Errorf("%w: header %q is %q, want a positive integer", ErrBadEnvelope, HeaderLedgerTimeline, s)
		}
		e.LedgerTimeline = int32(v)
	}
	for k, v := range h {
		if wireField[k] {
			continue
		}
		if e.Headers == nil {
			e.Headers = make(map[string]string, len(h))
		}
		e.Headers[k] = v
	}
	return e, nil
}

// ToMessage converts an envelope to a Watermill message whose UUID is the
// event ID and whose metadata are the wire headers, so any Watermill
// publisher carries the contract unchanged.
func (e Envelope) ToMessage() *message.Message {
	msg := message.NewMessage(e.EventID, e.Payload)
	for k, v := range e.WireHeaders() {
		msg.Metadata.Set(k, v)
	}
	return msg
}

// EnvelopeFromMessage is the inverse of ToMessage.
func EnvelopeFromMessage(msg *message.Message) (Envelope, error) {
	return EnvelopeFromHeaders(msg.Metadata, msg.Payload)
}

// AccountPosted is the JSON payload of TypeAccountPosted: one journal line as
// seen by its account. Delta is a signed decimal string in minor units,
// credit positive.
type AccountPosted struct {
	EventID   string    `json:"event_id"`
	JournalID string    `json:"journal_id"`
	Account   string    `json:"account"`
	Revision  int64     `json:"revision"`
	Currency  string    `json:"currency"`
	Delta     string    `json:"delta"`
	PostedAt  time.Time `json:"posted_at"`
}
