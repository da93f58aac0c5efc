package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/fsarchive"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

// printReport writes rep to stdout as indented JSON when asJSON, else as
// text prints it.
func printReport[T any](asJSON bool, rep T, text func(io.Writer, T)) error {
	if !asJSON {
		text(os.Stdout, rep)
		return nil
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// couldNotRun is exit code 2: the command did not get to a verdict.
func couldNotRun(err error) error {
	if err == nil {
		return nil
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	return &exitError{code: 2, err: err}
}

// reconcileConsumers are the consumers reconciliation reads: the
// configured ones, or the two example consumers on consumer.database.url.
func reconcileConsumers(cfg configs.Config) ([]configs.ReconcileConsumer, error) {
	if len(cfg.Reconcile.Consumers) > 0 {
		return cfg.Reconcile.Consumers, nil
	}
	if err := cfg.RequireConsumerDatabase(); err != nil {
		return nil, fmt.Errorf("%w (or set reconcile.consumers)", err)
	}
	return exampleReconcileConsumers(cfg.Consumer.Database.URL), nil
}

// exampleReconcileConsumers are the two example consumers on dsn as
// reconciliation reads them: both subscribe to the ledger's events, and
// the projection declares its balances as its balance view.
func exampleReconcileConsumers(dsn string) []configs.ReconcileConsumer {
	return []configs.ReconcileConsumer{
		{Name: projection.Name, DatabaseURL: dsn, Topics: []string{core.TopicEvents}, BalanceView: projection.BalanceView},
		{Name: auditlog.Name, DatabaseURL: dsn, Topics: []string{core.TopicEvents}},
	}
}

// consumerSource is how reconciliation reads consumer c through pool.
func consumerSource(c configs.ReconcileConsumer, pool *pgxpool.Pool) (ops.ConsumerSource, error) {
	src := ops.ConsumerSource{Name: c.Name, Reader: ops.InboxReader{Inbox: inboxstore.New(pool), Consumer: c.Name},
		RejectedFinal: c.RejectedFinal, Topics: c.Topics}
	if c.BalanceView != "" {
		v, err := opsstore.NewBalanceView(pool, c.BalanceView)
		if err != nil {
			return src, fmt.Errorf("consumer %s: %w", c.Name, err)
		}
		src.BalanceView = v
	}
	return src, nil
}

// requiredConsumers are the consumers archive and cleanup require coverage of.
func requiredConsumers(cfg configs.Config) []string {
	if len(cfg.Cleanup.RequiredConsumers) > 0 {
		return cfg.Cleanup.RequiredConsumers
	}
	if len(cfg.Reconcile.Consumers) > 0 {
		names := make([]string, len(cfg.Reconcile.Consumers))
		for i, c := range cfg.Reconcile.Consumers {
			names[i] = c.Name
		}
		return names
	}
	return []string{projection.Name, auditlog.Name}
}

// connectReadOnly opens a pool whose sessions are read-only whatever the
// role may do: reconciliation writes nothing to a consumer's database but
// the mark of a clean pass, in a read-write transaction it opens for it
// (inboxstore.Inbox.RecordMark).
func connectReadOnly(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	pc, err := postgres.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pc.MaxConns = 4
	return postgres.ConnectConfig(ctx, pc)
}

// readOnlyPools are the consumers' databases opened with connectReadOnly,
// one pool per database URL, shared by the consumers on it.
type readOnlyPools map[string]*pgxpool.Pool

// of returns the pool of c's database, opening it on first use.
func (ps readOnlyPools) of(ctx context.Context, c configs.ReconcileConsumer) (*pgxpool.Pool, error) {
	if pool, ok := ps[c.DatabaseURL]; ok {
		return pool, nil
	}
	pool, err := connectReadOnly(ctx, c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", c.Name, err)
	}
	ps[c.DatabaseURL] = pool
	return pool, nil
}

// each opens the database of every consumer in list and calls fn with it,
// stopping at the first error.
func (ps readOnlyPools) each(ctx context.Context, list []configs.ReconcileConsumer, fn func(configs.ReconcileConsumer, *pgxpool.Pool) error) error {
	for _, c := range list {
		pool, err := ps.of(ctx, c)
		if err != nil {
			return err
		}
		if err := fn(c, pool); err != nil {
			return err
		}
	}
	return nil
}

// requireConsumers checks the ledger's key and reads which consumers to
// read into list: configuration, known before anything connects.
func requireConsumers(cfg *configs.Config, list *[]configs.ReconcileConsumer) (err error) {
	if err := cfg.RequireDatabase(); err != nil {
		return err
	}
	*list, err = reconcileConsumers(*cfg)
	return err
}

func (ps readOnlyPools) close() {
	for _, pool := range ps {
		pool.Close()
	}
}

// openArchive returns the configured archive store, or nil when archive.dir is unset.
func openArchive(cfg configs.Config) (ops.ArchiveStore, error) {
	if cfg.Archive.Dir == "" {
		return nil, nil
	}
	st, err := fsarchive.Open(cfg.Archive.Dir)
	if err != nil {
		return nil, fmt.Errorf("config key archive.dir: %w", err)
	}
	return st, nil
}

func runReconcile(ctx context.Context, args []string) error {
	fs := newFlags("reconcile", "database.url", "consumer.database.url", "archive.dir")
	cutSeq := fs.Int64("cut", 0, "cut at this journal sequence (default: the last committed one)")
	cutTime := fs.String("cut-time", "", "cut at the last journal posted at or before this RFC 3339 time")
	asJSON := fs.Bool("json", false, "print one JSON object")
	limit := fs.Int("cap", 20, "most IDs listed per discrepancy class (counts are always complete)")
	settle := fs.Duration("settle", 10*time.Second, "how long to wait for in-flight ledger transactions before the cut counts as not provable")
	noRecord := fs.Bool("no-record", false, "do not record the verified coverage boundary and the consumers' marks when clean")
	full := fs.Bool("full", false, "check every event ID each consumer ever recorded, not only those changed since its last clean pass's mark")
	var (
		req  ops.CutRequest
		list []configs.ReconcileConsumer
	)
	checks := func(cfg *configs.Config) (err error) {
		req = ops.CutRequest{Sequence: *cutSeq, Settle: *settle}
		switch {
		case *cutSeq < 0:
			return fmt.Errorf("--cut must be a positive journal sequence, is %d", *cutSeq)
		case *cutSeq > 0 && *cutTime != "":
			return errors.New("--cut and --cut-time exclude each other")
		case *cutTime != "":
			t, err := time.Parse(time.RFC3339Nano, *cutTime)
			if err != nil {
				return fmt.Errorf("--cut-time %q: want RFC 3339, e.g. 2026-11-29T20:00:00Z", *cutTime)
			}
			req.Time = t
		}
		if *limit < 1 {
			return fmt.Errorf("--cap must be at least 1, is %d", *limit)
		}
		return requireConsumers(cfg, &list)
	}
	p, err := fs.start(ctx, args, needs{ledger: 4, archive: true, check: checks})
	if err != nil {
		return couldNotRun(err)
	}
	defer p.close()
	pools := readOnlyPools{}
	defer pools.close()
	var sources []ops.ConsumerSource
	err = pools.each(ctx, list, func(c configs.ReconcileConsumer, pool *pgxpool.Pool) error {
		src, err := consumerSource(c, pool)
		if err != nil {
			return err
		}
		sources = append(sources, src)
		return nil
	})
	if err != nil {
		return couldNotRun(err)
	}
	rep, err := ops.Reconcile(ctx, ops.ReconcileConfig{
		Ledger: opsstore.New(p.ledger), Consumers: sources, Archive: p.archive, Cut: req, Cap: *limit, Record: !*noRecord,
		Full: *full,
	})
	if err != nil {
		return couldNotRun(err)
	}
	if err := printReport(*asJSON, rep, printReconcile); err != nil {
		return couldNotRun(err)
	}
	if !rep.Clean {
		return &exitError{code: 1}
	}
	return nil
}

func printReconcile(w io.Writer, rep ops.Report) {
	c := rep.Cut
	fmt.Fprintf(w, "cut: journal sequence %d (last committed %d, reconciled above floor %d), covered outbox id %d, snapshot %s\n\n",
		c.Sequence, c.LastCommitted, c.Floor, c.CoveredOutboxID, c.TakenAt.UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tEXPECTED\tRELAYED\tAPPLIED\tDUPLICATES ABSORBED\tPARKED\tREJECTED\tDISCREPANCIES")
	for _, r := range rep.Consumers {
		d := r.Discrepancies
		n := d.JournalWithoutEvents.Count + d.Unrelayed.Count + d.Unproven.Count + d.Unknown.Count + d.MultipleApplied.Count +
			d.RevisionConflicts.Count
		if r.BalanceView != nil {
			n += r.BalanceView.Mismatch.Count
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", r.Name, r.Expected, r.Relayed, r.Applied, r.DuplicatesAbsorbed, r.Parked, r.Rejected, n)
	}
	tw.Flush()
	for _, r := range rep.Consumers {
		if r.Clean {
			continue
		}
		fmt.Fprintf(w, "\ndiscrepancies of %s:\n", r.Name)
		d := r.Discrepancies
		for _, cl := range []struct {
			name, what string
			c          ops.Class
		}{
			{"journal without its events", "journal lines; journals", d.JournalWithoutEvents},
			{"unrelayed (backlog)", "events", d.Unrelayed},
			{"without a final disposition (unproven)", "events", d.Unproven},
			{"disposition for an unknown event ID", "event IDs", d.Unknown},
			{"more than one applied disposition", "events", d.MultipleApplied},
		} {
			if cl.c.Count == 0 {
				continue
			}
			extra := ""
			if cl.c.OldestAgeSeconds > 0 {
				extra = fmt.Sprintf(", oldest %s", time.Duration(cl.c.OldestAgeSeconds*float64(time.Second)).Round(time.Millisecond))
			}
			more := ""
			if int64(len(cl.c.IDs)) < cl.c.Count {
				more = fmt.Sprintf(" (first %d shown)", len(cl.c.IDs))
			}
			fmt.Fprintf(w, "  %s: %d %s%s%s\n    %s\n", cl.name, cl.c.Count, cl.what, extra, more, strings.Join(cl.c.IDs, "\n    "))
		}
		if rc := d.RevisionConflicts; rc.Count > 0 {
			// IDs come from the wire: quoted, so no control character reaches the terminal.
			fmt.Fprintf(w, "  revision conflicts (a revision applied under another event ID; not applied, never covered): %d\n", rc.Count)
			for _, c := range rc.Conflicts {
				fmt.Fprintf(w, "    %q %q revision %d: applied event %q, conflicting event %q\n",
					c.AggregateType, c.AggregateID, c.Revision, c.AppliedEventID, c.EventID)
			}
		}
		printBalanceView(w, r.BalanceView)
		if len(d.Waiting) > 0 {
			fmt.Fprintf(w, "  seen but not final (parked, held, rejected or revision_conflict; not covered until resolved):\n")
			for _, we := range d.Waiting {
				fmt.Fprintf(w, "    %s  %s  %s: %s\n", we.EventID, we.Consumer, we.Disposition, we.Reason)
			}
		}
	}
	fmt.Fprintln(w)
	printLedgerProof(w, rep)
	for _, r := range rep.Consumers {
		printPass(w, r)
		if r.Coverage != nil {
			fmt.Fprintf(w, "coverage recorded: %s up to journal sequence %d, outbox id %d\n", r.Name, r.Coverage.CutSequence, r.Coverage.CoveredOutboxID)
		}
	}
	if rep.Clean {
		fmt.Fprintln(w, "result: clean")
	} else {
		fmt.Fprintln(w, "result: DISCREPANCIES (exit 1)")
	}
}

// printPass says how far back r's checks of its whole history read.
func printPass(w io.Writer, r ops.ConsumerReport) {
	p := r.Pass
	if p == nil {
		return
	}
	if p.SinceMark > 0 {
		fmt.Fprintf(w, "history checked: %s, what changed since mark %d (its last clean pass)", r.Name, p.SinceMark)
	} else {
		fmt.Fprintf(w, "history checked: %s, whole (%s)", r.Name, p.FullBecause)
	}
	if p.RecordedMark > 0 {
		fmt.Fprintf(w, "; mark %d recorded for the next pass", p.RecordedMark)
	}
	fmt.Fprintln(w)
}
