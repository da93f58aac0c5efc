package outboxrow

import (
	"encoding/json"
	"maps"
	"testing"
)

// PostgreSQL's text of a headers column is read directly when it has no
// escape, and otherwise by encoding/json: both give the same map, and an
// object that is not of strings is refused.
func TestDecodeHeaders(t *testing.T) {
	for in, want := range map[string]map[string]string{
		`{"idempotency_digest": "j0fYlg7OSJfSxtO1oHmVkzT13eeYS7BLI_hC0ihy_po"}`: {"idempotency_digest": "j0fYlg7OSJfSxtO1oHmVkzT13eeYS7BLI_hC0ihy_po"},
		`{"a": "", "b": "x: y, z"}`:        {"a": "", "b": "x: y, z"},
		`{"q": "say \"hi\"", "t": "a\tb"}`: {"q": `say "hi"`, "t": "a\tb"},
		`{"u": "\u00e9", "n": "é"}`:        {"u": "é", "n": "é"},
		`{"a":"b"}`:                        {"a": "b"},
	} {
		got, err := decodeHeaders([]byte(in))
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("%s: %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{`{"a": 1}`, `{"a": "b"`, `["a"]`, `{"a": "b", }`} {
		if got, err := decodeHeaders([]byte(in)); err == nil {
			t.Errorf("%s: %v, want an error", in, got)
		}
	}
}

// Whatever the input, the direct reading agrees with encoding/json
// whenever it takes the input at all.
func FuzzPlainHeaders(f *testing.F) {
	for _, s := range []string{`{"a": "b"}`, `{"a": "b", "c": "d"}`, `{"a": "b\"c"}`, `{}`, `{"a": "b",  "c": "d"}`, `{"": ""}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := plainHeaders(b)
		if !ok {
			return
		}
		var want map[string]string
		if err := json.Unmarshal(b, &want); err != nil || !maps.Equal(h, want) {
			t.Fatalf("%q: read %v, encoding/json %v (%v)", b, h, want, err)
		}
	})
}
