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
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, malformed(field, "is not a valid JSON array")
	}
	return items, nil
}
