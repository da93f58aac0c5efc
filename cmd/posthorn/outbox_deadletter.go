package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"

	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
)

// runOutboxDeadLetter moves the record the relay parked for an aggregate,
// one the sink can never take, to the dead_letters table and lets the
// aggregate's later events flow behind a skip marker
// (relaystore.Store.DeadLetter); the decision goes into the audit log with the
// operator's name.
func runOutboxDeadLetter(ctx context.Context, args []string) error {
	fs := newFlags("outbox dead-letter", "database.url")
	aggType := fs.String("aggregate-type", "", "the parked aggregate's type (account, journal, or a type your services publish)")
	aggID := fs.String("aggregate-id", "", "the parked aggregate's ID")
	eventID := fs.String("event-id", "", "the parked record's event ID, as outbox status shows it (optional: a check that it is the one)")
	operator := fs.String("operator", "", "who decides, for the audit log (default: the OS user)")
	p, err := fs.start(ctx, args, needs{ledger: 2, check: func(*configs.Config) error {
		if *aggType == "" || *aggID == "" {
			return errors.New("--aggregate-type and --aggregate-id are required (posthorn outbox status lists the parked ones)")
		}
		if *operator == "" {
			if u, err := user.Current(); err == nil {
				*operator = u.Username
			}
		}
		if *operator == "" {
			return errors.New("--operator: is required (who decides, for the audit log)")
		}
		return nil
	}})
	if err != nil {
		return err
	}
	defer p.close()
	host, _ := os.Hostname()
	d, err := relaystore.New(p.ledger).DeadLetter(ctx, *aggType, *aggID, *eventID, *operator, "cli@"+host, true)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s: event %s (revision %d, topic %s) moved to the dead_letters table; the relay sends a skip marker (%s) in its place and the aggregate's later events after it\n",
		printable(*aggType), printable(*aggID), d.EventID, d.Revision, printable(d.Topic), core.TypeDeadLettered)
	return nil
}
