// Package inboxstore is the consumers' inbox (consumers.Inbox for the
// consumers, ops.Inbox for reconciliation and retention): one row per
// consumer and event ID, written in the same transaction as the handler's
// effect, and per-aggregate positions for consumers whose handler depends
// on its predecessor.
//
// Invariant: an event's effect is applied at most once per consumer (the
// same event ID again is a duplicate), and for an ordered consumer only at
// the aggregate's next revision; a revision already applied under another
// event ID is recorded as a revision conflict, never absorbed.
package inboxstore
