package core

import (
	"fmt"
	"maps"
	"time"
)

// Format is how an envelope is laid out on the wire (sink.format). Every
// format keeps Posthorn's own contract headers, so Posthorn's consumers read
// any of them; a format only adds headers and, for debezium-outbox, routes
// events to another topic.
type Format string

const (
	// FormatPosthorn is the contract headers alone (the default).
	FormatPosthorn Format = "posthorn"
	// FormatCloudEvents adds the CloudEvents 1.0 attributes in binary
	// content mode, as the Kafka protocol binding names them (ce_ prefix).
	FormatCloudEvents Format = "cloudevents"
	// FormatDebeziumOutbox routes events as Debezium's Outbox Event Router
	// does by default (topic outbox.event.<aggregate type>, key the
	// aggregate ID) and adds its id header.
	FormatDebeziumOutbox Format = "debezium-outbox"
)

// Formats are the accepted values of sink.format.
var Formats = []Format{FormatPosthorn, FormatCloudEvents, FormatDebeziumOutbox}

// Headers a format adds (contract.md, "Headers per format").
const (
	HeaderCESpecVersion  = "ce_specversion"
	HeaderCEID           = "ce_id"
	HeaderCESource       = "ce_source"
	HeaderCEType         = "ce_type"
	HeaderCETime         = "ce_time"
	HeaderCESubject      = "ce_subject"
	HeaderCEPartitionKey = "ce_partitionkey"
	HeaderCESequence     = "ce_sequence"
	// HeaderCEContentType is CloudEvents' datacontenttype in binary mode.
	HeaderCEContentType = "content-type"
	// HeaderDebeziumID is the header Debezium's router puts the event ID in.
	HeaderDebeziumID = "id"
)

const (
	// CloudEventsSpecVersion is the CloudEvents version of FormatCloudEvents.
	CloudEventsSpecVersion = "1.0"
	// DefaultCloudEventsSource is ce_source unless sink.cloudevents.source
	// says otherwise.
	DefaultCloudEventsSource = "/posthorn"
	// ContentTypeJSON is the payloads' content type unless a writer set
	// another: the ledger's events and commands are JSON documents.
	ContentTypeJSON = "application/json"
	// DebeziumTopicPrefix is Debezium's default route.topic.replacement,
	// outbox.event.${routedByValue}, with aggregatetype as route.by.field.
	DebeziumTopicPrefix = "outbox.event."
	// sequenceDigits pads ce_sequence so that it orders as a string: the
	// digits of the largest int64.
	sequenceDigits = 19
)

// WireFormat lays envelopes out in one Format.
type WireFormat struct {
	Format Format
	// Source is ce_source under FormatCloudEvents: a URI reference naming
	// this outbox (DefaultCloudEventsSource when empty).
	Source string
}

// Topic returns where f publishes an envelope of kind and aggregateType
// that the outbox routes to topic. Debezium has no commands: under
// FormatDebeziumOutbox they keep their commands.<service> topics, as every
// record does under the other formats.
func (f WireFormat) Topic(kind Kind, topic, aggregateType string) string {
	if f.Format == FormatDebeziumOutbox && kind == KindEvent {
		return DebeziumTopicPrefix + aggregateType
	}
	return topic
}

// Apply returns e laid out in f: its topic and its extra headers. e and its
// Headers map are left as they are (a retry applies the format again).
// The headers a format adds replace extra headers of the same name; the
// contract headers still win over both (Envelope.WireHeaders).
func (f WireFormat) Apply(e Envelope) Envelope {
	switch f.Format {
	case FormatCloudEvents:
		h := headersWithRoom(e, 9)
		source := f.Source
		if source == "" {
			source = DefaultCloudEventsSource
		}
		h[HeaderCESpecVersion] = CloudEventsSpecVersion
		h[HeaderCEID] = e.EventID
		h[HeaderCESource] = source
		h[HeaderCEType] = e.Type
		h[HeaderCESubject] = e.AggregateID
		h[HeaderCEPartitionKey] = e.AggregateID
		h[HeaderCESequence] = fmt.Sprintf("%0*d", sequenceDigits, e.Revision)
		h[HeaderCEContentType] = e.MediaType()
		if !e.OccurredAt.IsZero() {
			h[HeaderCETime] = e.OccurredAt.UTC().Format(time.RFC3339Nano)
		}
		e.Headers = h
	case FormatDebeziumOutbox:
		h := headersWithRoom(e, 1)
		h[HeaderDebeziumID] = e.EventID
		e.Headers = h
		e.Topic = f.Topic(e.Kind, e.Topic, e.AggregateType)
	}
	return e
}

// headersWithRoom returns a copy of e's extra headers with room for n more.
func headersWithRoom(e Envelope, n int) map[string]string {
	h := make(map[string]string, len(e.Headers)+n)
	maps.Copy(h, e.Headers)
	return h
}
