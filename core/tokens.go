package core

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
)

// TokenHashPrefix marks a configured token given as its SHA-256 in hex, so
// a configuration need not hold the token itself.
const TokenHashPrefix = "sha256:"

// Tokens is a set of accepted secret tokens (the Posting API's bearer
// tokens, the console's action token), kept only as their SHA-256.
type Tokens struct {
	sums [][sha256.Size]byte
}

// ParseTokens returns the set of the configured tokens: each entry is the
// token or "sha256:<64 hex digits>". Errors name the entry by index, never
// its content.
func ParseTokens(list []string) (Tokens, error) {
	var ts Tokens
	for i, t := range list {
		if t == "" {
			return Tokens{}, fmt.Errorf("token %d is empty", i)
		}
		if h, ok := strings.CutPrefix(t, TokenHashPrefix); ok {
			var d [sha256.Size]byte
			if n, err := hex.Decode(d[:], []byte(h)); err != nil || n != sha256.Size || len(h) != 2*sha256.Size {
				return Tokens{}, fmt.Errorf("token %d starts with %q but is not followed by 64 hex digits", i, TokenHashPrefix)
			}
			ts.sums = append(ts.sums, d)
			continue
		}
		ts.sums = append(ts.sums, sha256.Sum256([]byte(t)))
	}
	return ts, nil
}

// Len is how many tokens are accepted; 0 means none is configured.
func (ts Tokens) Len() int { return len(ts.sums) }

// Match reports whether presented is one of the tokens, in time that does
// not depend on which one or on how much of it matches.
func (ts Tokens) Match(presented string) bool { return ts.Index(presented) >= 0 }

// Index is the position in the configured list of the token presented
// matches (the last, if several do), or -1; every token is compared, in
// time that does not depend on which one or on how much of it matches.
func (ts Tokens) Index(presented string) int {
	// Hashing first makes every comparison the same length, whatever the
	// presented token's length.
	p := sha256.Sum256([]byte(presented))
	found := -1
	for i, t := range ts.sums {
		eq := subtle.ConstantTimeCompare(p[:], t[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	return found
}

// Duplicate reports the first two entries (i < j) of the configured list
// that accept the same token, whether each was given as the token or as
// its hash.
func (ts Tokens) Duplicate() (i, j int, ok bool) {
	for j := range ts.sums {
		for i := range j {
			if ts.sums[i] == ts.sums[j] {
				return i, j, true
			}
		}
	}
	return 0, 0, false
}
