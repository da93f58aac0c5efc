package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// What the ledger answers when a posting is read back: the types the
// Posting API and the ledger store exchange.

// ErrIdempotencyConflict is returned when an Idempotency-Key was already
// used for a different request.
var ErrIdempotencyConflict = errors.New("idempotency key was used for a different request")

// ErrNotFound is returned by the readers for an unknown journal or account.
var ErrNotFound = errors.New("not found")

// CommittedLine is one line of a committed posting with the event it wrote.
type CommittedLine struct {
	Account   string    `json:"account"`
	Direction Direction `json:"direction"`
	Amount    string    `json:"amount"`
	Currency  string    `json:"currency"`
	Revision  int64     `json:"revision"`
	EventID   string    `json:"event_id,omitempty"`
}

// CommittedCommand is one command a committed posting wrote.
type CommittedCommand struct {
	EventID string          `json:"event_id"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// CommittedPosting is a posting as the ledger holds it.
type CommittedPosting struct {
	JournalID string             `json:"journal_id"`
	Sequence  int64              `json:"sequence"`
	PostedAt  time.Time          `json:"posted_at"`
	Entries   []CommittedLine    `json:"entries"`
	Metadata  map[string]string  `json:"metadata"`
	Commands  []CommittedCommand `json:"commands"`
}

// Account is an account's state: per-currency balances in minor units
// (credit positive, debit negative) and its revision.
type Account struct {
	ID       string           `json:"account"`
	Balances map[string]int64 `json:"-"`
	Revision int64            `json:"revision"`
}

// BalancesAtCut is the ledger at one cut: every account's revision and
// balances, read in one snapshot, so each balance is the sum of exactly
// the account's events up to its revision.
type BalancesAtCut struct {
	Revisions map[string]int64
	Balances  []AccountBalance
}

// AccountBalance is one account's balance in one currency.
type AccountBalance struct {
	Account, Currency string
	Balance           int64
}

// DefaultMetadataMaxBytes bounds, unless configured otherwise
// (outbox.metadata_max_bytes), the allow-listed metadata of one posting
// that travels with its events (keys plus values).
const DefaultMetadataMaxBytes = 1024

// ErrIdempotencyKeyLost is returned for a retry of a posting that a ledger
// failover lost and the recovery could not re-commit: the client was told
// the posting succeeded, the ledger no longer holds it, and a new posting
// under the same key would move the money a second time if the lost one
// reappears. Errors that wrap it are *IdempotencyKeyLostError.
var ErrIdempotencyKeyLost = errors.New("idempotency key lost in a ledger failover")

// IdempotencyKeyLostError names the lost posting a retried key belongs to.
type IdempotencyKeyLostError struct {
	JournalID string
	// Reason is why the recovery could not re-commit it.
	Reason string
}

func (e *IdempotencyKeyLostError) Error() string {
	return fmt.Sprintf("%s: journal %s was lost and not re-committed (%s)", ErrIdempotencyKeyLost, e.JournalID, e.Reason)
}

func (e *IdempotencyKeyLostError) Unwrap() error { return ErrIdempotencyKeyLost }
