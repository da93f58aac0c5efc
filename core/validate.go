package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of a posting request. They bound the work and the row sizes one
// request can cause; the API's 1 MiB body limit sits above them.
const (
	MinEntries         = 2
	MaxEntries         = 100
	MaxAmountDigits    = 18
	MaxMetadataKeys    = 32
	MaxMetadataKeyLen  = 64
	MaxMetadataValLen  = 512
	MaxCommands        = 10
	MaxCommandTypeLen  = 128
	MaxCommandPayload  = 16 << 10
	MaxAccountIDLength = 64
)

// ErrInvalidPosting is the sentinel every *InputError matches with errors.Is.
var ErrInvalidPosting = errors.New("invalid posting")

// InputError says what is wrong with a posting request and where.
//
// Field is the JSON path of the offending value (entries[1].amount,
// metadata["ref"], commands[0].type) or "" for the body as a whole.
// Malformed means the body does not have the request's shape (not JSON,
// a wrong JSON type, an unknown, duplicate or missing field): the API
// answers 400. Otherwise the shape is right but a value breaks a rule
// (amount grammar or range, currency, account, entry count, balance,
// limits): the API answers 422.
type InputError struct {
	Field     string
	Detail    string
	Malformed bool
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return "posting: " + e.Detail
	}
	return "posting: " + e.Field + ": " + e.Detail
}

// Is makes errors.Is(err, ErrInvalidPosting) true.
func (e *InputError) Is(target error) bool { return target == ErrInvalidPosting }

func malformed(field, format string, args ...any) *InputError {
	return &InputError{Field: field, Detail: fmt.Sprintf(format, args...), Malformed: true}
}

func invalid(field, format string, args ...any) *InputError {
	return &InputError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

var (
	accountRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)
	commandTypeRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*){2,}$`)
	metadataKeyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	// aggregateTypeRE is posthorn_publish's rule for an aggregate type (the
	// SQL function refuses any other), so every parked aggregate matches it.
	aggregateTypeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// MaxAggregateIDLen is the longest aggregate ID posthorn_publish accepts.
const MaxAggregateIDLen = 256

// ValidAggregateType reports whether s is an aggregate type the outbox can
// hold: the ledger's own (account, journal) or one posthorn_publish accepts.
func ValidAggregateType(s string) bool { return aggregateTypeRE.MatchString(s) }

// ValidAccountID reports whether s is an account ID the ledger accepts.
func ValidAccountID(s string) bool { return accountRE.MatchString(s) }

// ParsePosting decodes and validates a POST /v1/postings body. It never
// panics and returns either a balanced Posting or an *InputError naming the
// first offending field. Unknown and duplicate object members are rejected
// (a duplicate "amount" would otherwise be silently resolved to the last).
func ParsePosting(body []byte) (Posting, error) {
	top, ierr := decodeObject(body, "")
	if ierr != nil {
		return Posting{}, ierr
	}
	var p Posting
	var entriesRaw json.RawMessage
	for _, m := range top {
		switch m.name {
		case "entries":
			entriesRaw = m.value
		case "metadata":
			md, ierr := parseMetadata(m.value)
			if ierr != nil {
				return Posting{}, ierr
			}
			p.Metadata = md
		case "commands":
			cmds, ierr := parseCommands(m.value)
			if ierr != nil {
				return Posting{}, ierr
			}
			p.Commands = cmds
		default:
			return Posting{}, malformed(m.name, "unknown field %q", m.name)
		}
	}
	if entriesRaw == nil {
		return Posting{}, malformed("entries", "is required")
	}
	entries, ierr := parseEntries(entriesRaw)
	if ierr != nil {
		return Posting{}, ierr
	}
	p.Entries = entries
	if ierr := checkBalanced(entries); ierr != nil {
		return Posting{}, ierr
	}
	return p, nil
}

func parseEntries(raw json.RawMessage) ([]Entry, *InputError) {
	items, ierr := decodeArray(raw, "entries")
	if ierr != nil {
		return nil, ierr
	}
	if len(items) < MinEntries {
		return nil, invalid("entries", "has %d entries, a posting needs at least %d", len(items), MinEntries)
	}
	if len(items) > MaxEntries {
		return nil, invalid("entries", "has %d entries, at most %d are allowed", len(items), MaxEntries)
	}
	entries := make([]Entry, len(items))
	for i, item := range items {
		e, ierr := parseEntry(item, fmt.Sprintf("entries[%d]", i))
		if ierr != nil {
			return nil, ierr
		}
		entries[i] = e
	}
	return entries, nil
}

func parseEntry(raw json.RawMessage, path string) (Entry, *InputError) {
	members, ierr := decodeObject(raw, path)
	if ierr != nil {
		return Entry{}, ierr
	}
	vals := make(map[string]string, 4)
	for _, m := range members {
		switch m.name {
		case "account", "direction", "amount", "currency":
			s, ierr := decodeString(m.value, join(path, m.name))
			if ierr != nil {
				return Entry{}, ierr
			}
			vals[m.name] = s
		default:
			return Entry{}, malformed(join(path, m.name), "unknown field %q", m.name)
		}
	}
	for _, name := range []string{"account", "direction", "amount", "currency"} {
		if _, ok := vals[name]; !ok {
			return Entry{}, malformed(join(path, name), "is required")
		}
	}
	e := Entry{Account: vals["account"], Currency: vals["currency"]}
	if !accountRE.MatchString(e.Account) {
		return Entry{}, invalid(join(path, "account"), "%s must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$", quote(e.Account))
	}
	switch d := Direction(vals["direction"]); d {
	case Debit, Credit:
		e.Direction = d
	default:
		return Entry{}, invalid(join(path, "direction"), "%s must be \"debit\" or \"credit\"", quote(vals["direction"]))
	}
	amount, ierr := parseAmount(vals["amount"], join(path, "amount"))
	if ierr != nil {
		return Entry{}, ierr
	}
	e.Amount = amount
	if !ValidCurrency(e.Currency) {
		return Entry{}, invalid(join(path, "currency"), "%s is not an ISO 4217 alphabetic currency code", quote(e.Currency))
	}
	return e, nil
}

// parseAmount accepts exactly the canonical decimal form of a positive
// integer of at most 18 digits: no sign, no leading zero, no fraction, no
// exponent, no spaces. 18 digits always fit an int64, so the only
// overflow left to check is in sums.
func parseAmount(s, field string) (int64, *InputError) {
	switch {
	case s == "":
		return 0, invalid(field, "is empty, want a decimal string of a positive integer in minor units")
	case s[0] == '-':
		return 0, invalid(field, "%s is negative; the direction gives the sign", quote(s))
	case s[0] == '+':
		return 0, invalid(field, "%s has a sign; want digits only", quote(s))
	case strings.ContainsAny(s, ".,"):
		return 0, invalid(field, "%s has a fraction; amounts are integers in minor units", quote(s))
	case strings.ContainsAny(s, "eE") && strings.Trim(s, "0123456789eE") == "":
		return 0, invalid(field, "%s has an exponent; want plain digits", quote(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, invalid(field, "%s is not a decimal integer", quote(s))
		}
	}
	if strings.Trim(s, "0") == "" {
		return 0, invalid(field, "%s is zero; amounts must be positive", quote(s))
	}
	if s[0] == '0' {
		return 0, invalid(field, "%s has a leading zero", quote(s))
	}
	if len(s) > MaxAmountDigits {
		return 0, invalid(field, "has %d digits, at most %d are allowed", len(s), MaxAmountDigits)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil { // unreachable with ≤ 18 digits; kept so a change of limit cannot wrap
		return 0, invalid(field, "%s is out of range", quote(s))
	}
	return v, nil
}

// checkBalanced requires, per currency, debits equal to credits; sums that
// would overflow int64 are refused rather than wrapped.
func checkBalanced(entries []Entry) *InputError {
	type sums struct{ debit, credit int64 }
	per := make(map[string]*sums)
	for i, e := range entries {
		s := per[e.Currency]
		if s == nil {
			s = &sums{}
			per[e.Currency] = s
		}
		side := &s.credit
		if e.Direction == Debit {
			side = &s.debit
		}
		if *side > math.MaxInt64-e.Amount {
			return invalid(fmt.Sprintf("entries[%d].amount", i), "the %s %s total overflows a 64-bit integer", e.Currency, e.Direction)
		}
		*side += e.Amount
	}
	currencies := make([]string, 0, len(per))
	for c := range per {
		currencies = append(currencies, c)
	}
	sort.Strings(currencies)
	for _, c := range currencies {
		s := per[c]
		if s.debit != s.credit {
			return invalid("entries", "is unbalanced in %s: debits %d, credits %d; per currency, debits must equal credits", c, s.debit, s.credit)
		}
	}
	return nil
}

func parseMetadata(raw json.RawMessage) (map[string]string, *InputError) {
	if isNull(raw) {
		return nil, nil
	}
	if kindOf(raw) != "an object" {
		return nil, malformed("metadata", "must be an object of strings, got %s", kindOf(raw))
	}
	members, ierr := decodeObject(raw, "metadata")
	if ierr != nil {
		return nil, ierr
	}
	if len(members) > MaxMetadataKeys {
		return nil, invalid("metadata", "has %d keys, at most %d are allowed", len(members), MaxMetadataKeys)
	}
	md := make(map[string]string, len(members))
	for _, m := range members {
		field := fmt.Sprintf("metadata[%s]", strconv.Quote(truncate(m.name, 80)))
		if len(m.name) > MaxMetadataKeyLen {
			return nil, invalid(field, "key is %d bytes long, at most %d are allowed", len(m.name), MaxMetadataKeyLen)
		}
		if !metadataKeyRE.MatchString(m.name) {
			return nil, invalid(field, "key must match ^[A-Za-z0-9][A-Za-z0-9._-]*$")
		}
		v, ierr := decodeString(m.value, field)
		if ierr != nil {
			return nil, ierr
		}
		if len(v) > MaxMetadataValLen {
			return nil, invalid(field, "value is %d bytes long, at most %d are allowed", len(v), MaxMetadataValLen)
		}
		if i := strings.IndexByte(v, 0); i >= 0 {
			return nil, invalid(field, "value holds the NUL character (\\u0000) at byte %d, which the ledger cannot store", i)
		}
		md[m.name] = v
	}
	return md, nil
}

func parseCommands(raw json.RawMessage) ([]CommandSpec, *InputError) {
	if isNull(raw) {
		return nil, nil
	}
	items, ierr := decodeArray(raw, "commands")
	if ierr != nil {
		return nil, ierr
	}
	if len(items) > MaxCommands {
		return nil, invalid("commands", "has %d commands, at most %d are allowed", len(items), MaxCommands)
	}
	cmds := make([]CommandSpec, 0, len(items))
	for i, item := range items {
		path := fmt.Sprintf("commands[%d]", i)
		members, ierr := decodeObject(item, path)
		if ierr != nil {
			return nil, ierr
		}
		var c CommandSpec
		haveType := false
		for _, m := range members {
			switch m.name {
			case "type":
				s, ierr := decodeString(m.value, join(path, "type"))
				if ierr != nil {
					return nil, ierr
				}
				c.Type, haveType = s, true
			case "payload":
				if kindOf(m.value) != "an object" {
					return nil, malformed(join(path, "payload"), "must be a JSON object, got %s", kindOf(m.value))
				}
				var buf bytes.Buffer
				if err := json.Compact(&buf, m.value); err != nil {
					return nil, malformed(join(path, "payload"), "is not valid JSON")
				}
				if buf.Len() > MaxCommandPayload {
					return nil, invalid(join(path, "payload"), "is %d bytes long, at most %d are allowed", buf.Len(), MaxCommandPayload)
				}
				c.Payload = json.RawMessage(buf.Bytes())
			default:
				return nil, malformed(join(path, m.name), "unknown field %q", m.name)
			}
		}
		if !haveType {
			return nil, malformed(join(path, "type"), "is required")
		}
		if len(c.Type) > MaxCommandTypeLen || !commandTypeRE.MatchString(c.Type) {
			return nil, invalid(join(path, "type"), "%s must look like service.noun.verb (lower-case segments of a-z, 0-9, _ and -, at most %d characters)", quote(c.Type), MaxCommandTypeLen)
		}
		if c.Payload == nil {
			c.Payload = json.RawMessage(`{}`)
		}
		cmds = append(cmds, c)
	}
	return cmds, nil
}

// quote shows a user value in a detail safely: quoted and cut short, so an
// error message stays small whatever was sent.
func quote(s string) string { return strconv.Quote(truncate(s, 40)) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// identifierRE is a plain lower-case SQL identifier: what Posthorn accepts
// as a replication slot, publication or LOGIN role name, so that it needs
// no quoting anywhere.
var identifierRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// IsIdentifier reports whether s is a plain lower-case SQL identifier:
// ^[a-z_][a-z0-9_]{0,62}$.
func IsIdentifier(s string) bool { return identifierRE.MatchString(s) }
