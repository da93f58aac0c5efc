package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay/cdc"
)

// connectRelayPool opens the ledger pool under the relay's application
// name, so the open-transaction gauge does not count the relay itself.
func connectRelayPool(ctx context.Context, dsn string, history *postgres.HistoryWatch) (*pgxpool.Pool, error) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, postgres.ErrBadDSN
		}
		q := u.Query()
		q.Set("application_name", postgres.RelayApplicationName)
		u.RawQuery = q.Encode()
		dsn = u.String()
	} else {
		dsn += " application_name=" + postgres.RelayApplicationName
	}
	return connectWatched(ctx, dsn, 4, history)
}

// connectWatched is postgres.Connect, with every connection reading the
// ledger's history first when history is not nil.
func connectWatched(ctx context.Context, dsn string, conns int32, history *postgres.HistoryWatch) (*pgxpool.Pool, error) {
	if history == nil {
		return postgres.Connect(ctx, dsn, conns)
	}
	cfg, err := postgres.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = max(cfg.MaxConns, conns)
	history.Watch(cfg)
	pool, err := postgres.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	history.Recheck(pool)
	return pool, nil
}

// outboxStatus is the report of `outbox status`; later sections (uncertain
// rows, …) are added as fields and as sections of printStatus.
type outboxStatus struct {
	core.OutboxStatus
	// UncertainCount counts the uncertain rows (opsstore.Store.Uncertain:
	// unrelayed rows of a shard whose lease expired while owned, created
	// before it expired); Uncertain lists the first of them.
	UncertainCount int64                   `json:"uncertain_count"`
	Uncertain      []opsstore.UncertainRow `json:"uncertain"`
	// CDC is the replication slot of relay.cdc.slot, when it exists.
	CDC *cdc.SlotStatus `json:"cdc,omitempty"`
}

func runOutboxStatus(ctx context.Context, args []string) error {
	fs := newFlags("outbox status", "database.url")
	asJSON := fs.Bool("json", false, "print one JSON object")
	p, err := fs.start(ctx, args, needs{ledger: 2})
	if err != nil {
		return err
	}
	defer p.close()
	pool := p.ledger
	st, err := relaystore.New(pool).Status(ctx)
	if err != nil {
		return err
	}
	report := outboxStatus{OutboxStatus: st}
	if report.CDC, err = cdcSlotStatus(ctx, pool, p.cfg.Relay.CDC.Slot); err != nil {
		return err
	}
	if report.Uncertain, report.UncertainCount, err = opsstore.New(pool).Uncertain(ctx, 20); err != nil {
		return err
	}
	return printReport(*asJSON, report, printStatus)
}

func printStatus(w io.Writer, st outboxStatus) {
	if h := st.History; h != nil {
		fmt.Fprintf(w, "ledger history: %s\n", h)
		if !h.Accepted {
			fmt.Fprintln(w, "  the relay publishes nothing and the API takes no posting until it is accepted: posthorn failover check, then posthorn failover recover")
		}
	}
	printHorizon(w, st.Horizon)
	fmt.Fprintf(w, "backlog: %d unrelayed events\n", st.Backlog)
	fmt.Fprintf(w, "oldest unrelayed: %s\n", (time.Duration(st.OldestUnrelayedAge * float64(time.Second))).Round(time.Millisecond))
	fmt.Fprintln(w, "\nshards:")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  SHARD\tOWNER\tLEASE EXPIRES\tBACKLOG")
	for _, s := range st.Shards {
		owner, exp := "-", "-"
		if s.Owner != "" {
			owner = printable(s.Owner)
		}
		if s.ExpiresAt != nil {
			exp = s.ExpiresAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\n", s.Shard, owner, exp, s.Backlog)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nparked aggregates: %d\n", len(st.Parked))
	if len(st.Parked) > 0 {
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tID\tEVENT\tPARKED AT\tREASON")
		for _, p := range st.Parked {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", printable(p.AggregateType), printable(p.AggregateID), printable(p.EventID),
				p.ParkedAt.UTC().Format(time.RFC3339), printable(p.Reason))
		}
		tw.Flush()
		fmt.Fprintln(w, "  release one with: posthorn outbox release --aggregate-type TYPE --aggregate-id ID (or --account ID for an account)")
	}
	printUncertain(w, st)
	printCDCStatus(w, st.CDC)
}

// horizonWarnAge is when status calls a held horizon out: past it, the
// tables that churn keep minutes of dead versions.
const horizonWarnAge = 5 * time.Minute

// printHorizon says what holds the ledger's MVCC horizon back, if
// anything does.
func printHorizon(w io.Writer, h *core.LedgerHorizon) {
	if h == nil {
		fmt.Fprintln(w, "ledger horizon: held by nothing but running statements")
		return
	}
	age := "age unknown"
	if h.AgeSeconds >= 0 {
		age = (time.Duration(h.AgeSeconds * float64(time.Second))).Round(time.Second).String() + " old"
	}
	fmt.Fprintf(w, "ledger horizon: held by %s %s, %s, %d transactions behind", h.Kind, printable(h.Holder), age, h.XIDAge)
	if h.State != "" {
		fmt.Fprintf(w, " (%s)", printable(h.State))
	}
	fmt.Fprintln(w)
	if h.AgeSeconds >= horizonWarnAge.Seconds() {
		fmt.Fprintln(w, "  rows deleted or updated since it began cannot be vacuumed: end it if it is not needed (docs/operations.md, the ledger's horizon)")
	}
}

func runOutboxRelease(ctx context.Context, args []string) error {
	fs := newFlags("outbox release", "database.url")
	account := fs.String("account", "", "the parked account to release")
	journal := fs.String("journal", "", "the parked command journal to release (commands are ordered per journal)")
	aggType := fs.String("aggregate-type", "", "release this aggregate type with --aggregate-id (e.g. "+core.AggregateJournal+")")
	aggID := fs.String("aggregate-id", "", "the aggregate ID with --aggregate-type")
	var typ, id string
	p, err := fs.start(ctx, args, needs{ledger: 2, check: func(*configs.Config) error {
		n := 0
		if *account != "" {
			typ, id, n = core.AggregateAccount, *account, n+1
		}
		if *journal != "" {
			typ, id, n = core.AggregateJournal, *journal, n+1
		}
		if *aggType != "" || *aggID != "" {
			if *aggType == "" || *aggID == "" {
				return errors.New("--aggregate-type and --aggregate-id go together")
			}
			typ, id, n = *aggType, *aggID, n+1
		}
		if n != 1 {
			return errors.New("give exactly one of --account ID, --journal ID, or --aggregate-type T --aggregate-id ID (posthorn outbox status lists the parked ones)")
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close()
	if err := relaystore.New(p.ledger).Release(ctx, typ, id); err != nil {
		return err
	}
	fmt.Printf("%s %s released; the relay sends its records again from the one that was parked\n", printable(typ), printable(id))
	return nil
}

// printUncertain is the uncertain section of outbox status.
func printUncertain(w io.Writer, st outboxStatus) {
	fmt.Fprintf(w, "\nuncertain rows (unrelayed, in a shard whose lease expired while owned): %d\n", st.UncertainCount)
	if len(st.Uncertain) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tEVENT\tSHARD\tACCOUNT\tREVISION\tLEASE OWNER\tLEASE EXPIRED")
	for _, u := range st.Uncertain {
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\t%d\t%s\t%s\n", u.ID, u.EventID, u.Shard, printable(u.Account), u.Revision, printable(u.LeaseOwner), u.LeaseExpiry.UTC().Format(time.RFC3339))
	}
	tw.Flush()
	if st.UncertainCount > int64(len(st.Uncertain)) {
		fmt.Fprintf(w, "  (first %d shown)\n", len(st.Uncertain))
	}
	fmt.Fprintln(w, "  a relay taking the shard sends them again; or: posthorn outbox resend --from-id ID --to-id ID")
}

// runOutboxResend sends outbox rows again through the configured sink with
// their original event IDs (ops.Resend).
func runOutboxResend(ctx context.Context, args []string) error {
	fs := newFlags("outbox resend", "database.url", "sink.kind", "sink.kafka.brokers")
	ids := fs.StringArray("event-id", nil, "event ID to resend (repeatable)")
	from := fs.Int64("from-id", 0, "first outbox id of a range to resend (inclusive)")
	to := fs.Int64("to-id", 0, "last outbox id of the range (inclusive)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	p, err := fs.start(ctx, args, needs{ledger: 2, sink: true, check: func(*configs.Config) error {
		switch {
		case len(*ids) > 0 && (*from != 0 || *to != 0):
			return errors.New("--event-id excludes --from-id/--to-id")
		case len(*ids) == 0 && (*from < 1 || *to < *from):
			return errors.New("give --event-id (repeatable), or --from-id and --to-id with 1 <= from <= to")
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close()
	res, err := ops.Resend(ctx, ops.ResendConfig{Ledger: opsstore.New(p.ledger), Sink: p.sink, EventIDs: *ids, FromID: *from, ToID: *to})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("resent %d rows with their original event IDs through sink %s; %d unrelayed rows got their marker after the ACK\n", res.Sent, p.cfg.Sink.Kind, res.Marked)
	return nil
}
