package opsstore_test

import (
	"context"
	"testing"

	"github.com/posthorn/posthorn/adapters/fsarchive"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

// Cleanup removes outbox rows whose event IDs the consumers' inboxes keep
// until their own retention prunes them: on a busy ledger, millions of
// them. The next reconcile finds them in the archive, read once, and stays
// clean, so the next archive and cleanup can run; it used to give up past
// 100,000 such IDs.
func TestReconcileAfterCleanupOfMoreEventsThanItOnceKept(t *testing.T) {
	t.Parallel()
	const events = 120_000
	ctx := context.Background()
	_, ledger := pgtest.Ledger(t)
	_, consumer := pgtest.Consumer(t)
	names := []string{"balance-projection", "audit-log"}
	loadReconcileLedger(t, ledger, events)
	loadInboxes(t, consumer, names, events)
	in := inboxstore.New(consumer)
	var sources []ops.ConsumerSource
	for _, c := range names {
		sources = append(sources, ops.ConsumerSource{Name: c, Reader: ops.InboxReader{Inbox: in, Consumer: c}})
	}
	store := opsstore.New(ledger)
	archive, err := fsarchive.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reconcile := func(when string) ops.Report {
		rep, err := ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: store, Consumers: sources, Archive: archive, Record: true})
		if err != nil || !rep.Clean {
			t.Fatalf("reconcile %s: clean %v, %v; unknown %+v", when, rep.Clean, err, rep.Consumers)
		}
		return rep
	}
	reconcile("before the cleanup")
	if _, err := ops.Archive(ctx, ops.ArchiveConfig{Ledger: store, Archive: archive, Required: names}); err != nil {
		t.Fatal(err)
	}
	res, err := ops.Cleanup(ctx, ops.CleanupConfig{Ledger: store, Archive: archive, Required: names})
	if err != nil || res.Deleted != events {
		t.Fatalf("cleanup deleted %d of %d rows: %v", res.Deleted, events, err)
	}
	rep := reconcile("after it")
	for _, c := range rep.Consumers {
		if c.Expected != 0 || c.Discrepancies.Unknown.Count != 0 {
			t.Fatalf("%s after the cleanup: %d events expected in the cut, %d unknown", c.Name, c.Expected, c.Discrepancies.Unknown.Count)
		}
	}
	t.Logf("reconcile after cleaning up %d events both inboxes still hold: clean, cut at sequence %d", events, rep.Cut.Sequence)
}
