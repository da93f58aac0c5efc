package core

import (
	"encoding/json"
	"time"
)

// Direction is the side of a journal line.
type Direction string

const (
	Debit  Direction = "debit"
	Credit Direction = "credit"
)

// Entry is one validated journal line: an integer amount in minor units,
// always positive; the direction gives its sign (credit positive).
type Entry struct {
	Account   string
	Direction Direction
	Amount    int64
	Currency  string
}

// Delta is the entry's signed effect on its account's balance.
func (e Entry) Delta() int64 {
	if e.Direction == Debit {
		return -e.Amount
	}
	return e.Amount
}

// CommandSpec is a command requested with a posting: its type names the
// owning service in its first segment; its payload is passed as given.
type CommandSpec struct {
	Type    string
	Payload json.RawMessage
}

// Posting is a validated, balanced journal entry ready to be written.
type Posting struct {
	Entries  []Entry
	Metadata map[string]string
	Commands []CommandSpec
}

// PostedEvent is one ledger.account.posted event written by a posting.
type PostedEvent struct {
	EventID  string `json:"event_id"`
	Account  string `json:"account"`
	Revision int64  `json:"revision"`
}

// PostedCommand is one command written by a posting.
type PostedCommand struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
}

// PostingResult is what a committed posting returns (the API's 201 body).
type PostingResult struct {
	JournalID string          `json:"journal_id"`
	Sequence  int64           `json:"sequence"`
	Events    []PostedEvent   `json:"events"`
	Commands  []PostedCommand `json:"commands"`
	PostedAt  time.Time       `json:"-"`
}
