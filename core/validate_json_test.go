package core

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzFastPathsMatchTheDecoder: whatever the fast paths take, encoding/json
// takes too and yields the same members, items and strings. The seeds (run
// in every `go test`) include what the fast paths must leave to the
// decoder: repeated names, escapes, non-ASCII, Unicode spaces around the
// value, trailing data.
func FuzzFastPathsMatchTheDecoder(f *testing.F) {
	for _, s := range []string{
		`{"entries":[{"account":"acc-1","direction":"debit","amount":"5","currency":"EUR"},{"account":"acc-2","direction":"credit","amount":"5","currency":"EUR"}],"metadata":{"source":"demo"}}`,
		" \t\r\n{ \"a\" : [ 1 , -2.5e3 , true , null , \"x\" , { \"b\" : [ ] } ] , \"c\" : { } } \n",
		`{"a":"]}\"\\","b":"{[","c":[["}"]]}`,
		`{"a":1,"a":2}`,
		`{"a\u0062":1}`,
		`{"é":"é"}`,
		"{\"a\":\"\x01\"}",
		"{}\f",
		"\u00a0{}",
		`{"a":1}{"b":2}`,
		`{"a":1,}`,
		`[]`, `[1,[2,[3]],{"a":[]}]`, ` [ "a" , "b\"" ] `,
		`"plain"`, `"esc\"aped"`, `"tab	in"`, `"é"`, `""`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if members, ok := splitObject(raw); ok {
			want, ierr := decodeObjectTokens(raw, "")
			if ierr != nil {
				t.Fatalf("fast path took %q, the decoder refuses it: %v", raw, ierr)
			}
			if len(members) != len(want) {
				t.Fatalf("%q: %d members, the decoder %d", raw, len(members), len(want))
			}
			for i := range want {
				if members[i].name != want[i].name || !bytes.Equal(members[i].value, want[i].value) {
					t.Fatalf("%q member %d: %q=%q, the decoder %q=%q", raw, i, members[i].name, members[i].value, want[i].name, want[i].value)
				}
			}
		}
		if items, ok := splitArray(raw); ok {
			var want []json.RawMessage
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatalf("fast path took %q, the decoder refuses it: %v", raw, err)
			}
			if len(items) != len(want) {
				t.Fatalf("%q: %d items, the decoder %d", raw, len(items), len(want))
			}
			for i := range want {
				if !bytes.Equal(items[i], want[i]) {
					t.Fatalf("%q item %d: %q, the decoder %q", raw, i, items[i], want[i])
				}
			}
		}
		if s, end, ok := plainString(raw, 0); ok && end == len(raw) {
			var want string
			if err := json.Unmarshal(raw, &want); err != nil || s != want {
				t.Fatalf("%q: fast path %q, the decoder %q (%v)", raw, s, want, err)
			}
		}
	})
}
