package core

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
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

// CanonicalPosting encodes a validated posting deterministically, so two
// requests that mean the same (whitespace, member order, an absent versus
// an empty metadata object aside) encode identically. Idempotency compares
// its SHA-256 (PostingHash) to tell a retry from a different request under
// the same key. Command payloads are compared as compacted JSON.
func CanonicalPosting(p Posting) []byte {
	type entry struct {
		Account   string `json:"account"`
		Direction string `json:"direction"`
		Amount    int64  `json:"amount"`
		Currency  string `json:"currency"`
	}
	type command struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	c := struct {
		Entries  []entry           `json:"entries"`
		Metadata map[string]string `json:"metadata"`
		Commands []command         `json:"commands"`
	}{Entries: make([]entry, len(p.Entries)), Metadata: p.Metadata, Commands: make([]command, len(p.Commands))}
	if c.Metadata == nil {
		c.Metadata = map[string]string{}
	}
	for i, e := range p.Entries {
		c.Entries[i] = entry{e.Account, string(e.Direction), e.Amount, e.Currency}
	}
	for i, cmd := range p.Commands {
		c.Commands[i] = command(cmd)
	}
	b, err := json.Marshal(c) // maps encode with sorted keys
	if err != nil {
		// Only an invalid RawMessage payload can fail, and ParsePosting
		// compacts every payload; fall back to a form that still differs
		// per payload rather than hiding the difference.
		return []byte(fmt.Sprintf("%#v", p))
	}
	return b
}

// PostingHash is the SHA-256 of CanonicalPosting.
func PostingHash(p Posting) [32]byte { return sha256.Sum256(CanonicalPosting(p)) }

// IdempotencyDigest is what a posting's events carry of its idempotency
// key (HeaderIdempotencyDigest): the SHA-256 of the key and the request's
// PostingHash, base64url without padding (43 characters). A retry of the
// same request under the same key has the same digest; the key itself
// never leaves the ledger.
func IdempotencyDigest(key string, hash [32]byte) string {
	h := sha256.New()
	h.Write([]byte("posthorn idempotency digest v1\x00"))
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(hash[:])
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}
