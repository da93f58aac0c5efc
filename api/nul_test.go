package api_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// JSON allows \u0000 in a string; PostgreSQL's text and jsonb do not. A
// metadata value holding it is refused as 422 naming the field, and nothing
// is written, instead of failing in the store with a 500 that invites a
// retry which can never succeed. (Command payloads are stored as bytes and
// keep it.)
func TestNULInMetadataIsRefusedAs422(t *testing.T) {
	t.Parallel()
	e := newEnv(t, tokenA)
	bearer := "Bearer " + tokenA
	legs := `"entries":[` + entry("acc-a", "debit", "5", "EUR") + "," + entry("acc-b", "credit", "5", "EUR") + `]`
	before := pgtest.LedgerState(t, e.pool)
	for _, tc := range []struct{ name, body, field string }{
		{"NUL in a metadata value", `{` + legs + `,"metadata":{"reference":"inv\u0000-1"}}`, `metadata["reference"]`},
		{"NUL alone", `{` + legs + `,"metadata":{"a":"x","b":"\u0000"}}`, `metadata["b"]`},
	} {
		r := e.do(t, request{body: tc.body, key: "k-" + tc.name, auth: bearer})
		if r.status != http.StatusUnprocessableEntity || r.problem.Field != tc.field || !strings.Contains(r.problem.Detail, tc.field) {
			t.Errorf("%s: %d field %q detail %q; want 422 naming %s", tc.name, r.status, r.problem.Field, r.problem.Detail, tc.field)
		}
	}
	if after := pgtest.LedgerState(t, e.pool); !maps.Equal(before, after) {
		t.Errorf("refused postings changed the ledger:\nbefore %v\nafter  %v", before, after)
	}
	// What the ledger does take still passes: a backslash before u0000 in
	// metadata, a NUL in a command payload.
	e.create(t, request{body: `{` + legs + `,"metadata":{"path":"C:\\u0000"},"commands":[{"type":"payouts.payout.execute","payload":{"to":"\u0000"}}]}`,
		key: "k-fine", auth: bearer})

	// Negative control: past the parser, the same posting fails in the
	// store as an internal error, not as bad input: without the check the
	// API answered 500.
	store := ledgerstore.New(e.pool, ledgerstore.Config{})
	_, _, err := store.Post(context.Background(), "k-direct", core.Posting{
		Entries: []core.Entry{
			{Account: "acc-a", Direction: core.Debit, Amount: 5, Currency: "EUR"},
			{Account: "acc-b", Direction: core.Credit, Amount: 5, Currency: "EUR"},
		},
		Metadata: map[string]string{"reference": "inv\x00-1"},
	})
	if err == nil || errors.Is(err, core.ErrInvalidPosting) {
		t.Fatalf("the store took or classified a NUL metadata value (err %v): the check guards nothing", err)
	}
}
