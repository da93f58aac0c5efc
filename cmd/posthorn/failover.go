package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/ops"
)

func runFailoverCheck(ctx context.Context, args []string) error {
	return runFailover(ctx, "failover check", args)
}

func runFailoverRecover(ctx context.Context, args []string) error {
	return runFailover(ctx, "failover recover", args)
}

// runFailover reads the consumers reconcile reads (their inboxes, and the
// audit log's table, which keeps every event whole) against the ledger.
// check and recover --dry-run exit 1 when there is something to recover
// (lost events, revisions to move, keys to record, or a history not
// accepted) and 0 when clean; recover exits 0 once it recovered or found
// nothing to do and nothing is left that is not whole (parked aggregates,
// unrelayed rows after --settle, lost events or keys it could not
// restore), 1 when something is; 2 means it could not run.
func runFailover(ctx context.Context, name string, args []string) error {
	fs := newFlags(name, "database.url", "consumer.database.url")
	asJSON := fs.Bool("json", false, "print one JSON object")
	sinkSince := fs.Duration("sink-since", 24*time.Hour, "with sink.kind kafka, also read the events topic's records of this last while (whole records: lost postings rebuild from them); 0 reads no sink")
	whole := fs.Bool("whole", false, "read every consumer's events whole, not from the mark of its last clean reconcile (which is used only when the ledger holds that pass's witness)")
	margin := fs.Int64("margin", 1000, "how far past their last values, beyond one per lost event or journal, the outbox ids and journal sequence move (values the old primary gave to rows no source saw)")
	var dryRun *bool
	var settle *time.Duration
	if name == "failover recover" {
		dryRun = fs.Bool("dry-run", false, "say what the recovery would write, and write nothing")
		settle = fs.Duration("settle", 30*time.Second, "once the history is accepted, how long to wait for the relay to send the unrelayed rows before reporting what is still not whole")
	}
	var list []configs.ReconcileConsumer
	checks := func(cfg *configs.Config) (err error) {
		if *margin < 0 {
			return fmt.Errorf("--margin must be 0 or more, is %d", *margin)
		}
		if *sinkSince < 0 {
			return fmt.Errorf("--sink-since must be 0 or more, is %s", *sinkSince)
		}
		if settle != nil && *settle < 0 {
			return fmt.Errorf("--settle must be 0 or more, is %s", *settle)
		}
		return requireConsumers(cfg, &list)
	}
	p, err := fs.start(ctx, args, needs{ledger: 2, check: checks})
	if err != nil {
		return couldNotRun(err)
	}
	defer p.close()
	pools := readOnlyPools{}
	defer pools.close()
	var sources []ops.SeenSource
	if err := pools.each(ctx, list, func(c configs.ReconcileConsumer, pool *pgxpool.Pool) error {
		sources = append(sources, opsstore.InboxSeen{Pool: pool, Consumer: c.Name})
		if c.Name == auditlog.Name {
			sources = append(sources, opsstore.AuditLogSeen{Pool: pool, Consumer: c.Name})
		}
		return nil
	}); err != nil {
		return couldNotRun(err)
	}
	if *sinkSince > 0 {
		s, err := sinkSeen(p.cfg.Sink, time.Now().Add(-*sinkSince))
		if err != nil {
			return couldNotRun(err)
		}
		if s != nil {
			s = sinkErrorHint{s}
		}
		if s == nil {
			p.log.Warn("the sink is not read: only a Kafka sink is; the check relies on the consumers' databases", "sink", p.cfg.Sink.Kind)
		} else {
			sources = append(sources, s)
		}
	}
	cfg := ops.FailoverConfig{Ledger: opsstore.NewFailoverStore(p.ledger), Sources: sources, Margin: *margin, Whole: *whole}
	if settle != nil {
		cfg.Settle = *settle
	}
	var rep ops.FailoverReport
	if dryRun == nil {
		rep, err = ops.FailoverCheck(ctx, cfg)
	} else {
		rep, err = ops.FailoverRecover(ctx, cfg, *dryRun)
	}
	if err != nil {
		return couldNotRun(err)
	}
	if err := printReport(*asJSON, rep, printFailover); err != nil {
		return couldNotRun(err)
	}
	switch {
	case rep.Remaining != nil && !rep.Remaining.Whole():
		return &exitError{code: 1}
	case rep.Remaining == nil && !rep.Clean():
		return &exitError{code: 1}
	}
	return nil
}

// sinkSeen is the failover check's reader of the sink: the account events'
// topic (as sink.format routes them) of a Kafka sink, from since on; nil
// for the other kinds.
func sinkSeen(s configs.Sink, since time.Time) (ops.SeenSource, error) {
	if s.Kind != "kafka" {
		return nil, nil
	}
	bc, err := brokerConfig(s)
	if err != nil {
		return nil, err
	}
	topic := s.WireFormat().Topic(core.KindEvent, core.TopicEvents, core.AggregateAccount)
	return kafka.TopicSeen{Config: bc.Kafka, Topics: []string{topic}, Since: since}, nil
}

// sinkErrorHint says, on a failed read of the sink, how to check without it.
type sinkErrorHint struct{ ops.SeenSource }

func (s sinkErrorHint) Seen(ctx context.Context, each func([]ops.SeenEvent) error) error {
	var eachErr error
	err := s.SeenSource.Seen(ctx, func(batch []ops.SeenEvent) error {
		eachErr = each(batch)
		return eachErr
	})
	if err != nil && eachErr == nil {
		return fmt.Errorf("%w (--sink-since 0 checks against the consumers' databases alone)", err)
	}
	return err
}

func printFailover(w io.Writer, rep ops.FailoverReport) {
	h := rep.History
	fmt.Fprintf(w, "ledger history: system %d timeline %d; accepted: system %d timeline %d", h.SystemIdentifier, h.Timeline,
		h.AcceptedSystemIdentifier, h.AcceptedTimeline)
	if h.Accepted {
		fmt.Fprintln(w, " (accepted)")
	} else {
		fmt.Fprintln(w, " (NOT ACCEPTED: the relay holds until a recovery accepts it)")
	}
	fmt.Fprintf(w, "sources read:")
	for _, s := range rep.Sources {
		switch {
		case s.SinceMark > 0:
			fmt.Fprintf(w, " %s (%d events changed since mark %d);", s.Name, s.Events, s.SinceMark)
		case s.WholeBecause != "":
			fmt.Fprintf(w, " %s (%d events, whole: %s);", s.Name, s.Events, s.WholeBecause)
		default:
			fmt.Fprintf(w, " %s (%d events);", s.Name, s.Events)
		}
	}
	fmt.Fprintf(w, " %d events read", rep.Read)
	if rep.NotLedger > 0 {
		fmt.Fprintf(w, ", %d IDs that are no UUID (not the ledger's) left out", rep.NotLedger)
	}
	fmt.Fprintln(w)
	if len(rep.Lost) > 0 {
		fmt.Fprintf(w, "\nlost events (seen, not in the ledger): %d\n", len(rep.Lost))
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "EVENT ID\tJOURNAL\tAGGREGATE\tREVISION\tAMOUNT\tSEEN BY\tRECOVERY")
		for _, l := range rep.Lost {
			amount := "?"
			if l.Delta != "" {
				amount = l.Delta + " " + l.Currency
			}
			journal := l.JournalID
			if journal == "" {
				journal = "?"
			}
			what := "re-commit with its IDs"
			switch {
			case l.Recorded:
				what = "recorded by an earlier recovery: " + l.Reason
			case !l.Rebuild:
				what = "CANNOT REBUILD: " + l.Reason
			}
			// From the wire: quoted, so no control character reaches the terminal.
			fmt.Fprintf(tw, "%q\t%q\t%q %q\t%d\t%q\t%s\t%s\n", l.EventID, journal, l.AggregateType, l.AggregateID, l.Revision,
				amount, strings.Join(l.SeenBy, ", "), what)
		}
		tw.Flush()
	}
	pl := rep.Plan
	printKeys(w, pl.Keys, rep.KeysUnknown)
	if len(pl.Moves) > 0 {
		fmt.Fprintf(w, "\nrevisions behind what was published: %d aggregates\n", len(pl.Moves))
		for _, m := range pl.Moves {
			fmt.Fprintf(w, "  %q %q: ledger %d, published %d\n", m.AggregateType, m.AggregateID, m.Ledger, m.Seen)
		}
	}
	fmt.Fprintln(w)
	switch {
	case rep.Recovery != nil:
		r := rep.Recovery
		fmt.Fprintf(w, "recovered: %d journals re-committed (%s), %d sequences and %d aggregates moved (outbox ids past %d, journal sequence past %d), %d lost events recorded, %d idempotency keys restored and %d recorded lost, history accepted\n",
			len(r.Rebuilt), strings.Join(r.Rebuilt, ", "), r.SequencesMoved, r.AggregatesMoved, pl.OutboxIDPast, pl.JournalSequencePast, r.Recorded,
			r.KeysRestored, r.KeysLost)
	case rep.Remaining != nil:
		fmt.Fprintln(w, "nothing to recover: the history is accepted and no lost event is new")
	case rep.Clean():
		fmt.Fprintln(w, "result: clean, nothing to do")
	case rep.NothingToDo():
		fmt.Fprintln(w, "result: nothing lost; the history needs accepting: run posthorn failover recover (exit 1)")
	default:
		fmt.Fprintf(w, "result: a recovery would re-commit %d journals, record %d lost events it cannot rebuild and %d idempotency keys, move %d aggregates and the sequences (outbox ids past %d, journal sequence past %d), then accept the history (exit 1)\n",
			len(pl.Rebuild), len(pl.Record), len(pl.Keys), len(pl.Moves), pl.OutboxIDPast, pl.JournalSequencePast)
	}
	if rep.Remaining != nil {
		printNotWhole(w, *rep.Remaining)
	}
}

// printKeys lists the lost postings' idempotency keys by journal: what a
// client's retry of each will get.
func printKeys(w io.Writer, keys []ops.LostKey, unknown []ops.UnknownKey) {
	if len(keys)+len(unknown) == 0 {
		return
	}
	fmt.Fprintf(w, "\nidempotency keys of the lost postings: %d\n", len(keys)+len(unknown))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOURNAL\tA CLIENT'S RETRY OF ITS KEY")
	for _, k := range keys {
		what := "answers 200 with the re-committed journal, writes nothing (restored)"
		if !k.Restored {
			what = "is refused with 409 idempotency-key-lost-in-failover (the posting is lost: " + k.Reason + ")"
		}
		fmt.Fprintf(tw, "%q\t%s\n", k.JournalID, what)
	}
	for _, u := range unknown {
		fmt.Fprintf(tw, "%q\tCANNOT BE RECOGNISED: %s\n", u.JournalID, u.Reason)
	}
	tw.Flush()
}

// printNotWhole says what the recovery left for the operator, or that
// nothing is.
func printNotWhole(w io.Writer, n ops.NotWhole) {
	if n.Whole() {
		fmt.Fprintln(w, "whole: no parked aggregate, no unrelayed row, every lost posting re-committed with its key")
		return
	}
	fmt.Fprintln(w, "\nSTILL NOT WHOLE (exit 1):")
	if n.Unrelayed > 0 {
		fmt.Fprintf(w, "  %d outbox rows unrelayed, the oldest %.0fs old: is a relay running on the new primary, and, with relay.standby_flush: required, a standby streaming from it? (posthorn outbox status)\n", n.Unrelayed, n.OldestSeconds)
	}
	for _, p := range n.Parked {
		fmt.Fprintf(w, "  relay parked %q %q at event %q: %q (posthorn outbox release, or dead-letter)\n", p.AggregateType, p.AggregateID, p.EventID, p.Reason)
	}
	for _, p := range n.ConsumerParked {
		fmt.Fprintf(w, "  consumer %q parked %q %q: %q (posthorn consume release, once the ledger holds what it applied)\n", p.Consumer, p.AggregateType, p.AggregateID, p.Reason)
	}
	if n.NotRebuilt > 0 {
		fmt.Fprintf(w, "  %d lost events not re-committed (listed above; posthorn.failover_lost): the ledger lacks them until an operator posts what it lacks\n", n.NotRebuilt)
	}
	for _, k := range n.KeysLost {
		fmt.Fprintf(w, "  the key of lost journal %q is refused on retry: tell its client the posting did not survive the failover\n", k.JournalID)
	}
	for _, u := range n.KeysUnknown {
		fmt.Fprintf(w, "  the key of lost journal %q is unknown: a retry of it would post again\n", u.JournalID)
	}
}
