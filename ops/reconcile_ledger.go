package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"strconv"

	"github.com/posthorn/posthorn/core"
)

// The ledger proof: reconciliation proves the ledger from its journal in
// the cut's snapshot, so that a change made behind the Posting API's back
// is named. The journal lines are the record; everything else is derived
// from them and checked against them:
//
//   - every account's balance in a currency (account_balances) is the sum
//     of its journal lines in that currency (credit positive);
//   - every account's revision is its number of journal lines, which are
//     numbered 1..n (the lines' (account, revision) is unique, so count =
//     max means gapless);
//   - every outbox row of the ledger's aggregate (account) is the event of
//     one journal line: same account, revision and journal, type
//     ledger.account.posted, and a payload that decodes, as a consumer
//     decodes it, to that line's currency and signed amount;
//   - for a consumer that declares a balance view, every row of the view
//     is the sum of the account's lines in that currency up to the
//     revision the row says it applied.
//
// Any difference is a discrepancy of the ledger: the report is not clean
// and no consumer's coverage is recorded, so cleanup cannot pass it.

// LedgerProof is what reconciliation proved of the ledger from its journal.
type LedgerProof struct {
	// Accounts, Balances and Events count what was compared: accounts
	// (their revisions), balance rows, and the ledger's outbox events.
	Accounts int64 `json:"accounts"`
	Balances int64 `json:"balances"`
	Events   int64 `json:"events"`
	// BalanceMismatch lists "account currency" pairs whose balance is not
	// the sum of the account's journal lines.
	BalanceMismatch Class `json:"balance_mismatch"`
	// RevisionMismatch lists accounts whose revision is not their number
	// of journal lines, or whose lines are not numbered 1..n.
	RevisionMismatch Class `json:"revision_mismatch"`
	// EventMismatch lists event IDs of outbox rows of aggregate type
	// account that are not the event of a journal line as written.
	EventMismatch Class `json:"event_mismatch"`
	// Details says what differs, for the first Cap of each class.
	Details []LedgerDiscrepancy `json:"details,omitempty"`
}

// Clean says whether the ledger agrees with its journal.
func (p LedgerProof) Clean() bool {
	return p.BalanceMismatch.Count+p.RevisionMismatch.Count+p.EventMismatch.Count == 0
}

// LedgerDiscrepancy is one named difference between the ledger (or a
// consumer's balance view) and the journal.
type LedgerDiscrepancy struct {
	// Class is balance, revision, event or balance_view.
	Class    string `json:"class"`
	Consumer string `json:"consumer,omitempty"`
	Account  string `json:"account,omitempty"`
	Currency string `json:"currency,omitempty"`
	EventID  string `json:"event_id,omitempty"`
	Detail   string `json:"detail"`
}

// BalanceViewCheck is a consumer's balance view held against the ledger.
type BalanceViewCheck struct {
	View string `json:"view"`
	// Compared counts the view's rows compared with the journal; Ahead
	// those the consumer applied beyond the cut (not comparable in it).
	Compared int64 `json:"compared"`
	Ahead    int64 `json:"ahead"`
	// Mismatch lists "account currency" pairs whose balance is not the sum
	// of the account's lines up to the revision the row says it applied.
	Mismatch Class               `json:"mismatch"`
	Details  []LedgerDiscrepancy `json:"details,omitempty"`
}

// LedgerReader reads the ledger's journal, balances and events in a cut's
// snapshot, on a connection of its own so that it runs beside the cut's
// event stream. Close ends it.
type LedgerReader interface {
	// JournalDrift returns the balance rows and accounts that disagree with
	// the journal lines, and how many balance rows and accounts there are.
	JournalDrift(ctx context.Context) (JournalDrift, error)
	// AccountEvents calls fn with every outbox row of aggregate type
	// account, each with the journal line of its account revision (nil if
	// there is none), in batches of up to batch.
	AccountEvents(ctx context.Context, batch int, fn func([]AccountEvent) error) error
	// LineSums returns, for each of rows in order, the sum of the account's
	// journal lines in the row's currency up to the row's revision, and the
	// account's revision in the snapshot.
	LineSums(ctx context.Context, rows []ProjectedBalance) ([]LineSum, error)
	Close()
}

// JournalDrift is what JournalDrift found.
type JournalDrift struct {
	Accounts, Balances int64
	Balance            []BalanceDrift
	Revision           []RevisionDrift
}

// BalanceDrift is a balance row that is not the sum of its lines. Balance
// and Lines are decimal strings, empty where there is no balance row or no
// line.
type BalanceDrift struct {
	Account, Currency string
	Balance, Lines    string
}

// RevisionDrift is an account whose revision is not its lines' count.
type RevisionDrift struct {
	Account                      string
	Revision, Lines, MaxRevision int64
	// NoAccount: lines name an account that has no accounts row.
	NoAccount bool
}

// AccountEvent is an outbox row of aggregate type account and the journal
// line of its account revision.
type AccountEvent struct {
	EventID, Kind, Type, Account string
	Revision                     int64
	JournalID                    string // empty: the row names no journal
	Payload                      []byte
	Line                         *LineAmount
}

// LineAmount is a journal line as its event must state it.
type LineAmount struct {
	JournalID, Currency string
	// Delta is signed, credit positive.
	Delta int64
}

// ProjectedBalance is one row of a consumer's balance view: the balance of
// an account in a currency after the consumer applied the account's
// events up to Revision.
type ProjectedBalance struct {
	Account, Currency string
	Balance           string // decimal, credit positive
	Revision          int64
}

// LineSum is LedgerReader.LineSums's answer for one row.
type LineSum struct {
	Sum             string // decimal
	AccountRevision int64
}

// viewName is a table or view name, optionally schema-qualified, in the
// lower-case form PostgreSQL folds unquoted names to.
var viewName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$`)

// ValidBalanceView says whether name can name a balance view
// (reconcile.consumers[].balance_view).
func ValidBalanceView(name string) bool { return viewName.MatchString(name) }

// BalanceViewReader reads a consumer's declared balance view
// (reconcile.consumers[].balance_view).
type BalanceViewReader interface {
	// View names the view, for the report.
	View() string
	ProjectedBalances(ctx context.Context) ([]ProjectedBalance, error)
}

// ledgerProof is a proof running beside the cut's matching.
type ledgerProof struct {
	done  chan struct{}
	proof LedgerProof
	views []*BalanceViewCheck // by consumer; nil without a view
	err   error
}

// startLedgerProof opens cut's ledger reader (in the cut's snapshot, so it
// must be called while the cut is open) and runs the proof and the
// consumers' balance views beside the matching; wait returns them.
func startLedgerProof(ctx context.Context, cut *Cut, cfg ReconcileConfig) (*ledgerProof, error) {
	lr, err := cut.LedgerReader(ctx)
	if err != nil {
		return nil, err
	}
	p := &ledgerProof{done: make(chan struct{}), views: make([]*BalanceViewCheck, len(cfg.Consumers))}
	go func() {
		defer close(p.done)
		defer lr.Close()
		if p.proof, p.err = proveLedger(ctx, lr, cfg.Cap, cfg.Batch); p.err != nil {
			return
		}
		for i, c := range cfg.Consumers {
			if c.BalanceView == nil {
				continue
			}
			if p.views[i], p.err = checkBalanceView(ctx, lr, c, cfg.Cap); p.err != nil {
				p.err = fmt.Errorf("consumer %s: balance view %s: %w", c.Name, c.BalanceView.View(), p.err)
				return
			}
		}
	}()
	return p, nil
}

func (p *ledgerProof) wait() error {
	<-p.done
	return p.err
}

// proveLedger compares balances, revisions and the ledger's events with
// the journal lines.
func proveLedger(ctx context.Context, lr LedgerReader, limit, batch int) (LedgerProof, error) {
	var p LedgerProof
	drift, err := lr.JournalDrift(ctx)
	if err != nil {
		return p, fmt.Errorf("ledger proof: %w", err)
	}
	p.Accounts, p.Balances = drift.Accounts, drift.Balances
	nb, nr := 0, 0
	for _, d := range drift.Balance {
		p.BalanceMismatch.add(limit, d.Account+" "+d.Currency)
		if nb++; nb <= limit {
			p.Details = append(p.Details, LedgerDiscrepancy{Class: "balance", Account: d.Account, Currency: d.Currency,
				Detail: fmt.Sprintf("balance %s, journal lines sum to %s", orNone(d.Balance, "(no balance row)"), orNone(d.Lines, "0 (no line)"))})
		}
	}
	for _, d := range drift.Revision {
		p.RevisionMismatch.add(limit, d.Account)
		if nr++; nr <= limit {
			detail := fmt.Sprintf("revision %d, %d journal lines numbered up to %d", d.Revision, d.Lines, d.MaxRevision)
			if d.NoAccount {
				detail = fmt.Sprintf("no account row, %d journal lines numbered up to %d", d.Lines, d.MaxRevision)
			}
			p.Details = append(p.Details, LedgerDiscrepancy{Class: "revision", Account: d.Account, Detail: detail})
		}
	}
	ne := 0
	err = lr.AccountEvents(ctx, batch, func(evs []AccountEvent) error {
		for _, e := range evs {
			p.Events++
			if why := eventMismatch(e); why != "" {
				p.EventMismatch.add(limit, e.EventID)
				if ne++; ne <= limit {
					p.Details = append(p.Details, LedgerDiscrepancy{Class: "event", Account: e.Account, EventID: e.EventID,
						Detail: fmt.Sprintf("revision %d: %s", e.Revision, why)})
				}
			}
		}
		return nil
	})
	if err != nil {
		return p, fmt.Errorf("ledger proof: %w", err)
	}
	return p, nil
}

func orNone(s, none string) string {
	if s == "" {
		return none
	}
	return s
}

// eventMismatch says how e differs from the event its journal line makes
// ("" when it does not). The payload is decoded as a consumer decodes it
// (encoding/json into core.AccountPosted), so what is compared is what a
// consumer would apply; the ledger writes exactly the canonical form, and
// any other spelling of the same numbers is named too.
func eventMismatch(e AccountEvent) string {
	l := e.Line
	switch {
	case l == nil:
		return "no journal line of this account revision"
	case e.Kind != string(core.KindEvent) || e.Type != core.TypeAccountPosted:
		return fmt.Sprintf("kind %s type %s, want an event %s", strconv.Quote(e.Kind), strconv.Quote(e.Type), core.TypeAccountPosted)
	case e.JournalID != l.JournalID:
		return fmt.Sprintf("journal %s, the line's is %s", strconv.Quote(e.JournalID), l.JournalID)
	}
	var p core.AccountPosted
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return "payload does not decode: " + err.Error()
	}
	want := strconv.FormatInt(l.Delta, 10)
	switch {
	case p.Delta != want:
		return fmt.Sprintf("delta %s, the journal line's is %s", strconv.Quote(p.Delta), want)
	case p.Currency != l.Currency:
		return fmt.Sprintf("currency %s, the journal line's is %s", strconv.Quote(p.Currency), l.Currency)
	case p.Account != e.Account || p.Revision != e.Revision:
		return fmt.Sprintf("payload names account %s revision %d", strconv.Quote(p.Account), p.Revision)
	case p.JournalID != l.JournalID || p.EventID != e.EventID:
		return fmt.Sprintf("payload names journal %s event %s", strconv.Quote(p.JournalID), strconv.Quote(p.EventID))
	}
	return ""
}

// checkBalanceView holds consumer c's balance view against the journal:
// each row must be the sum of the account's lines in its currency up to
// the revision it applied. A consumer applies an account's events in
// revision order, so this holds however far behind it is; a row ahead of
// the cut's snapshot is counted, not compared.
func checkBalanceView(ctx context.Context, lr LedgerReader, c ConsumerSource, limit int) (*BalanceViewCheck, error) {
	chk := &BalanceViewCheck{View: c.BalanceView.View()}
	rows, err := c.BalanceView.ProjectedBalances(ctx)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return chk, nil
	}
	sums, err := lr.LineSums(ctx, rows)
	if err != nil {
		return nil, err
	}
	if len(sums) != len(rows) {
		return nil, fmt.Errorf("line sums: %d answers for %d rows", len(sums), len(rows))
	}
	for i, row := range rows {
		s := sums[i]
		if row.Revision > s.AccountRevision {
			chk.Ahead++
			continue
		}
		chk.Compared++
		have, ok1 := new(big.Int).SetString(row.Balance, 10)
		want, ok2 := new(big.Int).SetString(s.Sum, 10)
		if ok1 && ok2 && have.Cmp(want) == 0 {
			continue
		}
		chk.Mismatch.add(limit, row.Account+" "+row.Currency)
		if len(chk.Details) < limit {
			chk.Details = append(chk.Details, LedgerDiscrepancy{Class: "balance_view", Consumer: c.Name, Account: row.Account,
				Currency: row.Currency, Detail: fmt.Sprintf("%s says %s at revision %d, journal lines up to it sum to %s",
					chk.View, strconv.Quote(row.Balance), row.Revision, s.Sum)})
		}
	}
	return chk, nil
}
