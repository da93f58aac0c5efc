package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

type member struct {
	name  string
	value json.RawMessage
}

// decodeObject splits one JSON object into its members in order, rejecting
// anything else, duplicate names and trailing data.
func decodeObject(raw []byte, path string) ([]member, *InputError) {
	if out, ok := splitObject(raw); ok {
		return out, nil
	}
	return decodeObjectTokens(raw, path)
}

// decodeObjectTokens is decodeObject through encoding/json's decoder, which
// also words every error.
func decodeObjectTokens(raw []byte, path string) ([]member, *InputError) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	what := path
	if what == "" {
		what = "body"
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, syntaxErr(path, what, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, malformed(path, "%s must be a JSON object, got %s", what, describe(tok))
	}
	var out []member
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxErr(path, what, err)
		}
		name, _ := tok.(string) // inside an object the decoder only yields string keys
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, syntaxErr(join(path, name), what, err)
		}
		if seen[name] {
			return nil, malformed(join(path, name), "duplicate field %q", name)
		}
		seen[name] = true
		out = append(out, member{name: name, value: v})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, syntaxErr(path, what, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, malformed(path, "%s has data after the JSON object", what)
	}
	return out, nil
}

func syntaxErr(field, what string, err error) *InputError {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return malformed(field, "%s is not valid JSON: unexpected end of input", what)
	}
	return malformed(field, "%s is not valid JSON: %v", what, err)
}

func describe(tok any) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "an array"
		}
		return "an object"
	case string:
		return "a string"
	case json.Number, float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

func kindOf(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func decodeString(raw json.RawMessage, field string) (string, *InputError) {
	if kindOf(raw) != "a string" {
		return "", malformed(field, "must be a string, got %s", kindOf(raw))
	}
	if s, end, ok := plainString(raw, 0); ok && end == len(raw) {
		return s, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", malformed(field, "is not a valid JSON string")
	}
	return s, nil
}

func decodeArray(raw json.RawMessage, field string) ([]json.RawMessage, *InputError) {
	if kindOf(raw) != "an array" {
		return nil, malformed(field, "must be an array, got %s", kindOf(raw))
	}
	if items, ok := splitArray(raw); ok {
		return items, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, malformed(field, "is not a valid JSON array")
	}
	return items, nil
}

// The fast paths below take a well-formed request apart in one pass each,
// without encoding/json's allocations per token: through the decoder alone
// a three-line posting cost the API 28 µs and 297 allocations, with them 9
// µs and 68 (BenchmarkParsePosting). They take only what is plainly
// valid (JSON that json.Valid accepts; names and strings of printable ASCII
// without escapes; no repeated name) and leave everything else, and every
// error, to the decoder. FuzzFastPathsMatchTheDecoder holds them to the
// decoder's results.

// maxFastMembers bounds the fast path's repeated-name check, which compares
// each name with those before it.
const maxFastMembers = 32

// splitObject is decodeObject for a plainly valid object; ok is false for
// anything else.
func splitObject(raw []byte) (out []member, ok bool) {
	raw = bytes.Trim(raw, jsonSpace)
	if len(raw) < 2 || raw[0] != '{' || !json.Valid(raw) {
		return nil, false
	}
	i := skipSpace(raw, 1)
	if raw[i] == '}' {
		return nil, true
	}
	for {
		name, end, ok := plainString(raw, i)
		if !ok || len(out) == maxFastMembers {
			return nil, false
		}
		for _, m := range out {
			if m.name == name {
				return nil, false
			}
		}
		i = skipSpace(raw, skipSpace(raw, end)+1) // past the ':'
		end = valueEnd(raw, i)
		out = append(out, member{name: name, value: raw[i:end]})
		i = skipSpace(raw, end)
		if raw[i] == '}' {
			return out, true
		}
		i = skipSpace(raw, i+1) // past the ','
	}
}

// splitArray is decodeArray's split for a valid array; ok is false for
// anything else.
func splitArray(raw []byte) (items []json.RawMessage, ok bool) {
	raw = bytes.Trim(raw, jsonSpace)
	if len(raw) < 2 || raw[0] != '[' || !json.Valid(raw) {
		return nil, false
	}
	items = []json.RawMessage{}
	i := skipSpace(raw, 1)
	if raw[i] == ']' {
		return items, true
	}
	for {
		end := valueEnd(raw, i)
		items = append(items, raw[i:end])
		i = skipSpace(raw, end)
		if raw[i] == ']' {
			return items, true
		}
		i = skipSpace(raw, i+1) // past the ','
	}
}

// plainString reads the JSON string at raw[i] when it holds only printable
// ASCII without escapes, and returns it and the index after its closing
// quote; ok is false for anything else.
func plainString(raw []byte, i int) (s string, end int, ok bool) {
	if i >= len(raw) || raw[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(raw); j++ {
		switch c := raw[j]; {
		case c == '"':
			return string(raw[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20 || c > 0x7e:
			return "", 0, false
		}
	}
	return "", 0, false
}

// valueEnd returns the index after the JSON value at raw[i], in a text that
// json.Valid accepted.
func valueEnd(raw []byte, i int) int {
	switch raw[i] {
	case '"':
		j := i + 1
		for ; j < len(raw) && raw[j] != '"'; j++ {
			if raw[j] == '\\' {
				j++ // the escaped character cannot end the string
			}
		}
		return j + 1
	case '{', '[':
		depth := 0
		for j := i; j < len(raw); j++ {
			switch raw[j] {
			case '"':
				j = valueEnd(raw, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(raw)
	}
	for j := i; j < len(raw); j++ { // a number, true, false or null
		switch raw[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(raw)
}

// jsonSpace is JSON's whitespace (bytes.TrimSpace would also take Unicode
// spaces, which JSON does not allow around a value).
const jsonSpace = " \t\n\r"

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}
