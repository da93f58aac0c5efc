package polling

import "github.com/posthorn/posthorn/core"

// Hooks let tests stall, crash and misorder the relay at exact points, and
// switch its protections off for the negative controls. They are not
// settings: only tests, and the fault suite's binary built with -tags
// posthorn_unsafe, pass them (NewWithHooks).
type Hooks struct {
	// BeforePublish runs after a batch is read and before the lease check
	// that precedes publishing; blocking in it simulates a stalled relay.
	BeforePublish func(batch []core.Envelope)
	// AfterAck runs after the sink ACKed a batch and before the marker is
	// written. A non-nil error simulates a crash: the relay stops at once,
	// writes no marker and releases no lease.
	AfterAck func(batch []core.Envelope) error
	// BeforeMarker runs right before the marker of an ACKed batch is written
	// (after AfterAck); blocking in it lets another relay take the leases.
	BeforeMarker func()
	// UnsafeOrderByXID reads rows in transaction-ID order: the negative
	// control of the ordering test.
	UnsafeOrderByXID bool
	// UnsafeCursor makes the relay remember the largest id it has read and
	// drop every row at or below it, as a "position > last" reader does:
	// the negative control of the late-commit test (a row whose
	// transaction commits late is stepped over for good).
	UnsafeCursor bool
	// UnsafeMarkBeforeAck writes the marker before publishing: the negative
	// control of the fault suite (a crash or a failed publish after the
	// marker loses the batch).
	UnsafeMarkBeforeAck bool
	// UnsafeSkipPositions fences a shard for exactly-once but does not mark
	// the rows its committed transactions hold: the negative control of
	// that read (an ACK-then-crash sends the committed rows again).
	UnsafeSkipPositions bool
}
