package demo

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
)

// Check names one end-to-end invariant; a Violation says which one broke.
type Check string

// The checks Verify runs.
const (
	// CheckRelayed: every committed event has its relay marker.
	CheckRelayed Check = "relayed"
	// CheckApplied: every committed event has exactly one applied
	// disposition per consumer (a missing row, or held, parked, rejected or
	// duplicate for the only row of an event ID, breaks it).
	CheckApplied Check = "applied_once"
	// CheckUnknown: no consumer has a disposition for an event ID the
	// ledger never committed (for instance one of a rolled-back
	// transaction).
	CheckUnknown Check = "no_unknown_events"
	// CheckRolledBack: none of the event IDs of transactions known to have
	// rolled back appears in any inbox.
	CheckRolledBack Check = "no_rolled_back_events"
	// CheckOrder: per account, the ordered consumer's applied revisions
	// are exactly 1 … the ledger's revision (in order, no gap), its
	// position equals the ledger's revision, and the revision its
	// projection last applied per currency is the ledger's last line of
	// that account and currency.
	CheckOrder Check = "revisions_in_order"
	// CheckBalances: the projection's balance of every account and
	// currency equals the ledger's.
	CheckBalances Check = "balances_equal"
)

// Violation is one broken invariant with a readable detail.
type Violation struct {
	Check  Check
	Detail string
}

func (v Violation) String() string { return string(v.Check) + ": " + v.Detail }

// Report is the outcome of Verify.
type Report struct {
	// Events is the number of committed events on the event topic;
	// Relayed how many of them carry the relay marker.
	Events  int64
	Relayed int64
	// Applied is, per consumer, how many of those events it applied.
	Applied map[string]int64
	// DuplicatesSuppressed is, per consumer, how many deliveries the inbox
	// absorbed (repeats of an event ID plus already-applied revisions).
	DuplicatesSuppressed map[string]int64
	// Accounts is the number of ledger accounts compared.
	Accounts      int
	BalancesMatch bool
	// Violations lists what broke, at most maxPerCheck per check (the
	// counts are in the details); empty means clean.
	Violations []Violation
}

// Clean reports whether no invariant broke.
func (r Report) Clean() bool { return len(r.Violations) == 0 }

// Has reports whether a check broke.
func (r Report) Has(c Check) bool {
	for _, v := range r.Violations {
		if v.Check == c {
			return true
		}
	}
	return false
}

// TotalDuplicates sums DuplicatesSuppressed over the consumers.
func (r Report) TotalDuplicates() int64 {
	var n int64
	for _, d := range r.DuplicatesSuppressed {
		n += d
	}
	return n
}

// MinApplied is the smallest Applied over the consumers (0 without any).
func (r Report) MinApplied() int64 {
	first := true
	var n int64
	for _, a := range r.Applied {
		if first || a < n {
			n, first = a, false
		}
	}
	return n
}

// VerifyOptions configures Verify.
type VerifyOptions struct {
	// Consumers are the consumers whose inboxes are checked; default the
	// two example consumers.
	Consumers []string
	// Ordered is the consumer whose per-account positions and projection
	// are checked (CheckOrder, CheckBalances); default balance-projection.
	// Empty string after defaults skips those checks.
	Ordered string
	// RolledBack are event IDs of transactions that rolled back.
	RolledBack []string
}

const maxPerCheck = 5

type inboxRow struct {
	disposition string
	account     string
	revision    int64
}

// Verify checks, with SQL over the ledger and the consumer database, the
// end-to-end invariants of mission.md once everything has been delivered:
// see the Check constants. It reads the whole outbox and inboxes, so it is
// meant for the end of a demo or a test run, not for production sizes.
// An error means it could not run; broken invariants are in the Report.
func Verify(ctx context.Context, ledger, consumer *pgxpool.Pool, o VerifyOptions) (Report, error) {
	if o.Consumers == nil {
		o.Consumers = []string{projection.Name, auditlog.Name}
		if o.Ordered == "" {
			o.Ordered = projection.Name
		}
	}
	r := Report{Applied: map[string]int64{}, DuplicatesSuppressed: map[string]int64{}}
	add := func(c Check, format string, args ...any) {
		r.Violations = append(r.Violations, Violation{c, fmt.Sprintf(format, args...)})
	}

	// The ledger's committed events: an outbox row exists only if its
	// posting committed.
	events := map[string]bool{} // event ID → relayed
	rows, err := ledger.Query(ctx, `SELECT o.event_id::text, `+opsstore.Relayed+` FROM outbox o WHERE o.topic = $1`, core.TopicEvents)
	if err != nil {
		return r, fmt.Errorf("verify: read outbox: %w", err)
	}
	for rows.Next() {
		var id string
		var relayed bool
		if err := rows.Scan(&id, &relayed); err != nil {
			rows.Close()
			return r, fmt.Errorf("verify: read outbox: %w", err)
		}
		events[id] = relayed
		r.Events++
		if relayed {
			r.Relayed++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("verify: read outbox: %w", err)
	}
	if r.Relayed != r.Events {
		add(CheckRelayed, "%d of %d events have no relay marker", r.Events-r.Relayed, r.Events)
	}

	rolledBack := map[string]bool{}
	for _, id := range o.RolledBack {
		rolledBack[strings.ToLower(id)] = true
		if _, ok := events[strings.ToLower(id)]; ok {
			add(CheckRolledBack, "event %s of a rolled-back transaction is in the outbox", id)
		}
	}

	in := inboxstore.New(consumer)
	for _, name := range o.Consumers {
		c, err := in.Count(ctx, name)
		if err != nil {
			return r, fmt.Errorf("verify: %w", err)
		}
		r.DuplicatesSuppressed[name] = c.DuplicatesAbsorbed
		seen, err := readInbox(ctx, consumer, name)
		if err != nil {
			return r, err
		}
		var missing, notApplied, unknown, rolled int
		var examples [4][]string
		note := func(k int, s string) {
			if len(examples[k]) < maxPerCheck {
				examples[k] = append(examples[k], s)
			}
		}
		for id := range events {
			row, ok := seen[id]
			switch {
			case !ok:
				missing++
				note(0, id)
			case row.disposition != string(core.DispositionApplied):
				notApplied++
				note(1, id+" is "+row.disposition)
			default:
				r.Applied[name]++
			}
		}
		for id := range seen {
			if _, ok := events[id]; !ok {
				unknown++
				note(2, id)
			}
			if rolledBack[id] {
				rolled++
				note(3, id)
			}
		}
		if missing > 0 {
			add(CheckApplied, "%s: %d of %d events have no disposition (never delivered), e.g. %v", name, missing, len(events), examples[0])
		}
		if notApplied > 0 {
			add(CheckApplied, "%s: %d events are not applied, e.g. %v", name, notApplied, examples[1])
		}
		if unknown > 0 {
			add(CheckUnknown, "%s: %d event IDs in the inbox were never committed by the ledger, e.g. %v", name, unknown, examples[2])
		}
		if rolled > 0 {
			add(CheckRolledBack, "%s: %d events of rolled-back transactions reached the inbox, e.g. %v", name, rolled, examples[3])
		}
		if name == o.Ordered {
			if err := checkOrder(ctx, ledger, consumer, name, seen, add); err != nil {
				return r, err
			}
		}
	}
	if o.Ordered != "" {
		n, ok, err := checkBalances(ctx, ledger, consumer, add)
		if err != nil {
			return r, err
		}
		r.Accounts, r.BalancesMatch = n, ok
	}
	return r, nil
}

func readInbox(ctx context.Context, pool *pgxpool.Pool, consumer string) (map[string]inboxRow, error) {
	rows, err := pool.Query(ctx, `SELECT event_id, disposition, aggregate_id, revision FROM consumer_inbox
		WHERE consumer = $1 AND aggregate_type = $2`, consumer, core.AggregateAccount)
	if err != nil {
		return nil, fmt.Errorf("verify: read inbox of %s: %w", consumer, err)
	}
	defer rows.Close()
	seen := map[string]inboxRow{}
	for rows.Next() {
		var id string
		var ir inboxRow
		if err := rows.Scan(&id, &ir.disposition, &ir.account, &ir.revision); err != nil {
			return nil, fmt.Errorf("verify: read inbox of %s: %w", consumer, err)
		}
		seen[strings.ToLower(id)] = ir
	}
	return seen, rows.Err()
}

// checkOrder compares, per account, the ledger's revision with the ordered
// consumer's applied revisions, position and projected revision per
// currency.
func checkOrder(ctx context.Context, ledger, consumer *pgxpool.Pool, name string, seen map[string]inboxRow, add func(Check, string, ...any)) error {
	ledgerRev := map[string]int64{}
	if err := collect(ctx, ledger, `SELECT id, revision FROM account_revisions`, func(r pgx.Rows) error {
		var id string
		var rev int64
		err := r.Scan(&id, &rev)
		ledgerRev[id] = rev
		return err
	}); err != nil {
		return err
	}
	applied := map[string][]int64{}
	for _, row := range seen {
		if row.disposition == string(core.DispositionApplied) {
			applied[row.account] = append(applied[row.account], row.revision)
		}
	}
	position := map[string]int64{}
	if err := collect(ctx, consumer, `SELECT aggregate_id, last_revision FROM consumer_positions
		WHERE consumer = $1 AND aggregate_type = $2`, func(r pgx.Rows) error {
		var id string
		var rev int64
		err := r.Scan(&id, &rev)
		position[id] = rev
		return err
	}, name, core.AggregateAccount); err != nil {
		return err
	}
	var bad []string
	accounts := sortedKeys(ledgerRev)
	for _, acc := range accounts {
		want := ledgerRev[acc]
		revs := applied[acc]
		sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
		contiguous := int64(len(revs)) == want
		for i, rv := range revs {
			contiguous = contiguous && rv == int64(i+1)
		}
		switch {
		case !contiguous:
			bad = append(bad, fmt.Sprintf("account %s: ledger revision %d, applied revisions %s", acc, want, summarize(revs)))
		case position[acc] != want:
			bad = append(bad, fmt.Sprintf("account %s: ledger revision %d, consumer position %d", acc, want, position[acc]))
		}
	}
	// The projection's per-currency revision is the last applied line of
	// that account and currency: a reordering would leave an older one.
	lastLine := map[[2]string]int64{}
	if err := collect(ctx, ledger, `SELECT account_id, currency, max(revision) FROM journal_lines GROUP BY 1, 2`, func(r pgx.Rows) error {
		var a, c string
		var rev int64
		err := r.Scan(&a, &c, &rev)
		lastLine[[2]string{a, c}] = rev
		return err
	}); err != nil {
		return err
	}
	if err := collect(ctx, consumer, `SELECT account, currency, revision FROM projection_balances`, func(r pgx.Rows) error {
		var a, c string
		var rev int64
		if err := r.Scan(&a, &c, &rev); err != nil {
			return err
		}
		if want := lastLine[[2]string{a, c}]; want != rev {
			bad = append(bad, fmt.Sprintf("account %s %s: projection last applied revision %d, ledger's last line revision %d", a, c, rev, want))
		}
		return nil
	}); err != nil {
		return err
	}
	if len(bad) > 0 {
		add(CheckOrder, "%s: %d accounts or account currencies out of order or with gaps, e.g. %v", name, len(bad), bad[:min(len(bad), maxPerCheck)])
	}
	return nil
}

// checkBalances compares account_balances with projection_balances both
// ways; it returns the number of accounts compared and whether all match.
func checkBalances(ctx context.Context, ledger, consumer *pgxpool.Pool, add func(Check, string, ...any)) (int, bool, error) {
	read := func(pool *pgxpool.Pool, q string) (map[[2]string]string, error) {
		m := map[[2]string]string{}
		err := collect(ctx, pool, q, func(r pgx.Rows) error {
			var a, c, b string
			err := r.Scan(&a, &c, &b)
			m[[2]string{a, c}] = b
			return err
		})
		return m, err
	}
	want, err := read(ledger, `SELECT account_id, currency, balance::text FROM account_balances`)
	if err != nil {
		return 0, false, err
	}
	got, err := read(consumer, `SELECT account, currency, balance::text FROM projection_balances`)
	if err != nil {
		return 0, false, err
	}
	accounts := map[string]bool{}
	var bad []string
	for k, w := range want {
		accounts[k[0]] = true
		g, ok := got[k]
		if !ok {
			g = "absent"
		}
		if g != w {
			bad = append(bad, fmt.Sprintf("%s %s: ledger %s, projection %s", k[0], k[1], w, g))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			bad = append(bad, fmt.Sprintf("%s %s: ledger absent, projection %s", k[0], k[1], g))
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		add(CheckBalances, "%d balances differ, e.g. %v", len(bad), bad[:min(len(bad), maxPerCheck)])
	}
	return len(accounts), len(bad) == 0, nil
}

func collect(ctx context.Context, pool *pgxpool.Pool, q string, scan func(pgx.Rows) error, args ...any) error {
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// summarize renders a sorted revision list compactly: 1-40, 42, 44-50.
func summarize(revs []int64) string {
	if len(revs) == 0 {
		return "none"
	}
	var parts []string
	start := revs[0]
	for i := 1; i <= len(revs); i++ {
		if i < len(revs) && revs[i] == revs[i-1]+1 {
			continue
		}
		end := revs[i-1]
		if start == end {
			parts = append(parts, fmt.Sprint(start))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", start, end))
		}
		if i < len(revs) {
			start = revs[i]
		}
	}
	if len(parts) > 8 {
		parts = append(parts[:8], "…")
	}
	return strings.Join(parts, ", ")
}
