package core_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/core"
)

const validBody = `{
  "entries": [
    {"account": "acc-alice", "direction": "debit",  "amount": "1250", "currency": "EUR"},
    {"account": "acc-bob",   "direction": "credit", "amount": "1250", "currency": "EUR"}
  ],
  "metadata": {"reference": "inv-2026-0042"},
  "commands": [{"type": "payouts.payout.execute", "payload": {"beneficiary": "acc-bob"}}]
}`

func TestParsePostingAcceptsTheContractExample(t *testing.T) {
	t.Parallel()
	p, err := core.ParsePosting([]byte(validBody))
	if err != nil {
		t.Fatal(err)
	}
	want := []core.Entry{
		{Account: "acc-alice", Direction: core.Debit, Amount: 1250, Currency: "EUR"},
		{Account: "acc-bob", Direction: core.Credit, Amount: 1250, Currency: "EUR"},
	}
	if fmt.Sprint(p.Entries) != fmt.Sprint(want) {
		t.Errorf("entries = %+v", p.Entries)
	}
	if p.Metadata["reference"] != "inv-2026-0042" || len(p.Commands) != 1 || p.Commands[0].Type != "payouts.payout.execute" ||
		string(p.Commands[0].Payload) != `{"beneficiary":"acc-bob"}` {
		t.Errorf("posting = %+v", p)
	}
	if p.Entries[0].Delta() != -1250 || p.Entries[1].Delta() != 1250 {
		t.Error("debit must be negative, credit positive")
	}
}

func TestParsePostingAcceptsEdgeValues(t *testing.T) {
	t.Parallel()
	max18 := strings.Repeat("9", 18)
	for name, body := range map[string]string{
		"18-digit amounts":      entries(line("a", "debit", max18, "EUR"), line("b", "credit", max18, "EUR")),
		"multi-currency":        entries(line("a", "debit", "1", "EUR"), line("b", "credit", "1", "EUR"), line("a", "debit", "2", "USD"), line("b", "credit", "2", "USD")),
		"same account twice":    entries(line("a", "debit", "5", "EUR"), line("a", "credit", "5", "EUR")),
		"64-char account":       entries(line(strings.Repeat("x", 64), "debit", "1", "JPY"), line("b.c:d_e-f", "credit", "1", "JPY")),
		"100 entries":           entries(manyLines(100)...),
		"null optional members": `{"entries":[` + line("a", "debit", "1", "EUR") + `,` + line("b", "credit", "1", "EUR") + `],"metadata":null,"commands":null}`,
		"command w/o payload":   `{"entries":[` + line("a", "debit", "1", "EUR") + `,` + line("b", "credit", "1", "EUR") + `],"commands":[{"type":"svc.noun.verb"}]}`,
	} {
		if _, err := core.ParsePosting([]byte(body)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func line(account, direction, amount, currency string) string {
	return fmt.Sprintf(`{"account":%q,"direction":%q,"amount":%q,"currency":%q}`, account, direction, amount, currency)
}

func entries(lines ...string) string { return `{"entries":[` + strings.Join(lines, ",") + `]}` }

func manyLines(n int) []string {
	out := make([]string, n)
	for i := range out {
		dir := "debit"
		if i%2 == 1 {
			dir = "credit"
		}
		out[i] = line(fmt.Sprintf("acc-%d", i), dir, "3", "EUR")
	}
	return out
}

// BadPostingBodies are request bodies the validator must refuse, with the
// field and class (malformed → 400, invalid → 422) it must report. The API
// tests reuse the same shapes through HTTP.
func TestParsePostingRefusesBadInput(t *testing.T) {
	t.Parallel()
	ok1, ok2 := line("a", "debit", "5", "EUR"), line("b", "credit", "5", "EUR")
	withEntry := func(e string) string { return entries(e, ok2) }
	tests := []struct {
		name, body, field string
		malformed         bool
	}{
		{"empty body", ``, "", true},
		{"not JSON", `{entries:`, "", true},
		{"truncated", `{"entries":[` + ok1, "entries", true},
		{"array body", `[]`, "", true},
		{"null body", `null`, "", true},
		{"trailing data", entries(ok1, ok2) + `{}`, "", true},
		{"unknown top field", `{"entries":[` + ok1 + `,` + ok2 + `],"memo":"x"}`, "memo", true},
		{"duplicate top field", `{"entries":[` + ok1 + `,` + ok2 + `],"entries":[]}`, "entries", true},
		{"missing entries", `{"metadata":{}}`, "entries", true},
		{"entries not array", `{"entries":{}}`, "entries", true},
		{"entry not object", entries(`"x"`, ok2), "entries[0]", true},
		{"unknown entry field", withEntry(`{"account":"a","direction":"debit","amount":"5","currency":"EUR","memo":"x"}`), "entries[0].memo", true},
		{"duplicate amount", withEntry(`{"account":"a","direction":"debit","amount":"5","amount":"500","currency":"EUR"}`), "entries[0].amount", true},
		{"missing amount", withEntry(`{"account":"a","direction":"debit","currency":"EUR"}`), "entries[0].amount", true},
		{"missing account", entries(ok1, `{"direction":"credit","amount":"5","currency":"EUR"}`), "entries[1].account", true},
		{"amount as number", withEntry(`{"account":"a","direction":"debit","amount":5,"currency":"EUR"}`), "entries[0].amount", true},
		{"amount null", withEntry(`{"account":"a","direction":"debit","amount":null,"currency":"EUR"}`), "entries[0].amount", true},
		{"currency as number", withEntry(`{"account":"a","direction":"debit","amount":"5","currency":978}`), "entries[0].currency", true},
		{"zero amount", entries(line("a", "debit", "0", "EUR"), line("b", "credit", "0", "EUR")), "entries[0].amount", false},
		{"negative amount", entries(line("a", "debit", "-5", "EUR"), ok2), "entries[0].amount", false},
		{"plus sign", entries(line("a", "debit", "+5", "EUR"), ok2), "entries[0].amount", false},
		{"fraction", entries(line("a", "debit", "5.00", "EUR"), ok2), "entries[0].amount", false},
		{"exponent", entries(line("a", "debit", "5e0", "EUR"), ok2), "entries[0].amount", false},
		{"leading zero", entries(line("a", "debit", "05", "EUR"), ok2), "entries[0].amount", false},
		{"spaces", entries(line("a", "debit", " 5", "EUR"), ok2), "entries[0].amount", false},
		{"empty amount", entries(line("a", "debit", "", "EUR"), ok2), "entries[0].amount", false},
		{"19 digits", entries(line("a", "debit", "1"+strings.Repeat("0", 18), "EUR"), ok2), "entries[0].amount", false},
		{"int64 overflow in a sum", entries(line("a", "debit", strings.Repeat("9", 18), "EUR"), line("b", "debit", strings.Repeat("9", 18), "EUR"),
			line("c", "debit", strings.Repeat("9", 18), "EUR"), line("d", "debit", strings.Repeat("9", 18), "EUR"), line("e", "debit", strings.Repeat("9", 18), "EUR"),
			line("f", "debit", strings.Repeat("9", 18), "EUR"), line("g", "debit", strings.Repeat("9", 18), "EUR"), line("h", "debit", strings.Repeat("9", 18), "EUR"),
			line("i", "debit", strings.Repeat("9", 18), "EUR"), line("j", "debit", strings.Repeat("9", 18), "EUR"), ok2), "entries[9].amount", false},
		{"unbalanced", entries(ok1, line("b", "credit", "4", "EUR")), "entries", false},
		{"mixed currencies", entries(ok1, line("b", "credit", "5", "USD")), "entries", false},
		{"lower-case currency", entries(line("a", "debit", "5", "eur"), ok2), "entries[0].currency", false},
		{"unknown currency", entries(line("a", "debit", "5", "ABC"), ok2), "entries[0].currency", false},
		{"bad account", entries(line("-a", "debit", "5", "EUR"), ok2), "entries[0].account", false},
		{"account with space", entries(ok1, line("b c", "credit", "5", "EUR")), "entries[1].account", false},
		{"65-char account", entries(line(strings.Repeat("a", 65), "debit", "5", "EUR"), ok2), "entries[0].account", false},
		{"bad direction", entries(line("a", "DEBIT", "5", "EUR"), ok2), "entries[0].direction", false},
		{"one entry", entries(ok1), "entries", false},
		{"no entries", `{"entries":[]}`, "entries", false},
		{"too many entries", entries(manyLines(102)...), "entries", false},
		{"metadata not object", `{"entries":[` + ok1 + `,` + ok2 + `],"metadata":["x"]}`, "metadata", true},
		{"metadata value number", `{"entries":[` + ok1 + `,` + ok2 + `],"metadata":{"n":1}}`, `metadata["n"]`, true},
		{"metadata value too long", `{"entries":[` + ok1 + `,` + ok2 + `],"metadata":{"ref":"` + strings.Repeat("x", 513) + `"}}`, `metadata["ref"]`, false},
		{"metadata too many keys", `{"entries":[` + ok1 + `,` + ok2 + `],"metadata":{` + manyKeys(33) + `}}`, "metadata", false},
		{"metadata bad key", `{"entries":[` + ok1 + `,` + ok2 + `],"metadata":{"a b":"x"}}`, `metadata["a b"]`, false},
		{"command bad type", `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[{"type":"payouts"}]}`, "commands[0].type", false},
		{"command upper-case type", `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[{"type":"Payouts.payout.execute"}]}`, "commands[0].type", false},
		{"command missing type", `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[{"payload":{}}]}`, "commands[0].type", true},
		{"command payload array", `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[{"type":"a.b.c","payload":[]}]}`, "commands[0].payload", true},
		{"command payload too big", `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[{"type":"a.b.c","payload":{"x":"` + strings.Repeat("y", 17<<10) + `"}}]}`, "commands[0].payload", false},
		{"command unknown field", `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[{"type":"a.b.c","kind":"x"}]}`, "commands[0].kind", true},
		{"too many commands", `{"entries":[` + ok1 + `,` + ok2 + `],"commands":[` + strings.TrimSuffix(strings.Repeat(`{"type":"a.b.c"},`, 11), ",") + `]}`, "commands", false},
	}
	for _, tt := range tests {
		_, err := core.ParsePosting([]byte(tt.body))
		var ie *core.InputError
		if !errors.As(err, &ie) {
			t.Errorf("%s: err = %v, want *core.InputError", tt.name, err)
			continue
		}
		if !errors.Is(err, core.ErrInvalidPosting) {
			t.Errorf("%s: error does not match ErrInvalidPosting", tt.name)
		}
		if ie.Field != tt.field || ie.Malformed != tt.malformed {
			t.Errorf("%s: field %q malformed %v (%s), want field %q malformed %v", tt.name, ie.Field, ie.Malformed, ie.Detail, tt.field, tt.malformed)
		}
		if tt.field != "" && !strings.Contains(ie.Error(), tt.field) {
			t.Errorf("%s: message %q does not name %s", tt.name, ie.Error(), tt.field)
		}
		if len(ie.Detail) > 400 {
			t.Errorf("%s: detail is %d bytes; user values must be cut short", tt.name, len(ie.Detail))
		}
	}
}

func manyKeys(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	return strings.Join(parts, ",")
}

func TestCanonicalPostingIgnoresFormattingButNotMeaning(t *testing.T) {
	t.Parallel()
	a, err := core.ParsePosting([]byte(validBody))
	if err != nil {
		t.Fatal(err)
	}
	// Same request: other member order, whitespace and payload spacing.
	b, err := core.ParsePosting([]byte(`{"commands":[{"payload":{ "beneficiary" : "acc-bob" },"type":"payouts.payout.execute"}],"metadata":{"reference":"inv-2026-0042"},
		"entries":[{"currency":"EUR","amount":"1250","direction":"debit","account":"acc-alice"},{"account":"acc-bob","direction":"credit","amount":"1250","currency":"EUR"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if core.PostingHash(a) != core.PostingHash(b) {
		t.Errorf("same request, different hashes:\n%s\n%s", core.CanonicalPosting(a), core.CanonicalPosting(b))
	}
	// Another request: directions swapped, amount, metadata or payload changed.
	for name, body := range map[string]string{
		"swapped sides":  strings.NewReplacer(`"debit"`, `"credit"`, `"credit"`, `"debit"`).Replace(validBody),
		"other amount":   strings.ReplaceAll(validBody, "1250", "1251"),
		"other metadata": strings.Replace(validBody, "inv-2026-0042", "inv-2026-0043", 1),
		"other payload":  strings.Replace(validBody, `{"beneficiary": "acc-bob"}`, `{"beneficiary": "acc-eve"}`, 1),
	} {
		c, err := core.ParsePosting([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if core.PostingHash(a) == core.PostingHash(c) {
			t.Errorf("%s: hash equals the original's", name)
		}
	}
}

// FuzzParsePosting drives the decoder and validator with arbitrary bodies:
// no panic, and every accepted posting keeps the invariants the ledger
// relies on (2..100 entries, positive amounts, balanced per currency
// without overflow, valid accounts and currencies, valid JSON payloads and
// canonical encoding). The seeds run in every `go test`.
func FuzzParsePosting(f *testing.F) {
	f.Add([]byte(validBody))
	f.Add([]byte(entries(line("a", "debit", "5", "EUR"), line("b", "credit", "5", "EUR"))))
	f.Add([]byte(entries(line("a", "debit", strings.Repeat("9", 18), "EUR"), line("b", "credit", strings.Repeat("9", 18), "EUR"))))
	f.Add([]byte(`{"entries":[{"account":"a","direction":"debit","amount":"5","amount":"6","currency":"EUR"}]}`))
	f.Add([]byte(`{"entries":[{"account":"a","direction":"debit","amount":5e3,"currency":"EUR"}]}`))
	f.Add([]byte(`{"entries":null,"metadata":{"\u0000":"\ud800"},"commands":[{"type":"a.b.c","payload":{"x":[[[[1]]]]}}]}`))
	f.Add([]byte(`[{"entries":[]}]`))
	f.Add([]byte(`{"entries":[` + strings.Repeat(`{},`, 5) + `{}]}`))
	f.Add([]byte("\xff\xfe{}"))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := core.ParsePosting(body)
		if err != nil {
			var ie *core.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("error is %T, want *core.InputError: %v", err, err)
			}
			return
		}
		if len(p.Entries) < core.MinEntries || len(p.Entries) > core.MaxEntries {
			t.Fatalf("accepted %d entries", len(p.Entries))
		}
		sums := map[string]int64{}
		for i, e := range p.Entries {
			if e.Amount <= 0 || !core.ValidAccountID(e.Account) || !core.ValidCurrency(e.Currency) || (e.Direction != core.Debit && e.Direction != core.Credit) {
				t.Fatalf("accepted entry %d: %+v", i, e)
			}
			d := e.Delta()
			if (d > 0 && sums[e.Currency] > math.MaxInt64-d) || (d < 0 && sums[e.Currency] < math.MinInt64-d) {
				t.Fatalf("accepted a posting whose %s sum overflows", e.Currency)
			}
			sums[e.Currency] += d
		}
		for c, s := range sums {
			if s != 0 {
				t.Fatalf("accepted an unbalanced posting: %s sums to %d", c, s)
			}
		}
		for _, c := range p.Commands {
			if !json.Valid(c.Payload) {
				t.Fatalf("accepted invalid command payload %q", c.Payload)
			}
		}
		if !json.Valid(core.CanonicalPosting(p)) {
			t.Fatal("canonical encoding is not JSON")
		}
	})
}

// BenchmarkParsePosting is the API's validation of a typical body (three
// lines, one metadata key), as time and allocations per parse over a fixed
// 20,000 parses: make bench runs every benchmark once.
func BenchmarkParsePosting(b *testing.B) {
	body := []byte(`{"entries":[{"account":"acc-e2e-17","direction":"debit","amount":"61873","currency":"EUR"},` +
		`{"account":"acc-e2e-802","direction":"credit","amount":"40211","currency":"EUR"},` +
		`{"account":"acc-e2e-355","direction":"credit","amount":"21662","currency":"EUR"}],"metadata":{"source":"posthorn-demo"}}`)
	const parses = 20000
	for b.Loop() {
		for range parses {
			if _, err := core.ParsePosting(body); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*parses), "ns/parse")
	b.ReportMetric(testing.AllocsPerRun(100, func() { _, _ = core.ParsePosting(body) }), "allocs/parse")
	b.ReportMetric(0, "ns/op") // the workload is fixed; ns/op means nothing here
}
