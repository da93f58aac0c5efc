package cdc

import "github.com/posthorn/posthorn/core"

// Hooks let tests crash and stall the relay at exact points and switch its
// protections off for the negative controls. They are not settings: only
// tests pass them (NewWithHooks).
type Hooks struct {
	// BeforePublish runs before a batch is published (blocking simulates a
	// stall); a non-nil error is a crash before the publish.
	BeforePublish func(batch []core.Envelope) error
	// AfterAck runs after the sink ACKed a batch, before its marker. A
	// non-nil error is a crash: no marker, no confirmation, no lease
	// release.
	AfterAck func(batch []core.Envelope) error
	// AfterMark runs after the marker, before the position is confirmed to
	// the server; a non-nil error is a crash.
	AfterMark func(batch []core.Envelope) error
	// BeforeSlotCreate runs before a (new) slot is created.
	BeforeSlotCreate func()
	// SkipCatchUp skips reading the outbox before streaming (at start and
	// after a slot was lost): the negative control of slot-loss recovery.
	SkipCatchUp bool
	// UnsafeConfirmOnReceipt confirms a transaction's position as soon as it
	// is received, before the sink ACK: the negative control of the crash
	// test.
	UnsafeConfirmOnReceipt bool
	// UnsafeSkipPositions fences for exactly-once without marking what the
	// committed transactions hold: the negative control of that read.
	UnsafeSkipPositions bool
	// UnsafeSilentReader keeps the stream's reader from answering the
	// server while the relay delivers: the negative control of the WAL
	// sender timeout test.
	UnsafeSilentReader bool
	// UnsafeNoHeartbeat stops the idle relay's heartbeats and its
	// confirmations of the server's WAL end from keepalives: the negative
	// control of the idle-WAL test.
	UnsafeNoHeartbeat bool
}
