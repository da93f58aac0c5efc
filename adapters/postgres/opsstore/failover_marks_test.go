package opsstore_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
)

// The audit log is read from its consumer's mark through the consumer's
// inbox rows changed since, so the mark may be used only while retention
// has deleted no inbox row changed at or after it. A row pruned from
// before the mark leaves the mark in use; once retention deletes one
// changed after it, the mark is refused and the source read whole. The
// control: read from the mark all the same, the audit log's row of the
// pruned event is missing, which a whole read gives.
func TestSeenMarkIsRefusedOnceRetentionDeletedARowChangedAfterIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgtest.Consumer(t)
	in := inboxstore.New(pool)
	const consumer = "audit-log"
	src := opsstore.AuditLogSeen{Pool: pool, Consumer: consumer}
	applied := func(revision int64) string {
		t.Helper()
		id := uuid.Must(uuid.NewV7()).String()
		if _, err := pool.Exec(ctx, `
WITH i AS (INSERT INTO consumer_inbox (consumer, event_id, aggregate_type, aggregate_id, revision, disposition)
           VALUES ($1, $2, 'account', 'acc-a', $3, 'applied'))
INSERT INTO audit_log (event_id, type, aggregate_type, aggregate_id, revision, payload)
VALUES ($2, 'ledger.account.credited', 'account', 'acc-a', $3, '{}')`, consumer, id, revision); err != nil {
			t.Fatal(err)
		}
		return id
	}
	position := func(revision int64) {
		t.Helper()
		if _, err := pool.Exec(ctx, `
INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id, last_revision) VALUES ($1, 'account', 'acc-a', $2)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET last_revision = EXCLUDED.last_revision`, consumer, revision); err != nil {
			t.Fatal(err)
		}
	}
	prune := func() int64 {
		t.Helper()
		later := time.Now().Add(time.Hour)
		res, err := in.PruneInbox(ctx, consumer, ops.InboxHorizon{Ordered: later, Unordered: later}, 100)
		if err != nil {
			t.Fatal(err)
		}
		return res.Deleted
	}

	before := applied(1)
	// The mark is the oldest transaction running on the server: other
	// tests' may hold it below the first row's until they end.
	var p ops.PassStart
	wait.For(t, 30*time.Second, "a mark above the first row's transaction", func() bool {
		var err error
		if p, err = in.BeginPass(ctx, consumer, "h"); err != nil {
			t.Fatal(err)
		}
		var above bool
		if err := pool.QueryRow(ctx, `SELECT $1::text::xid8 > changed_xid FROM consumer_inbox WHERE event_id = $2`,
			strconv.FormatUint(p.Next, 10), before).Scan(&above); err != nil {
			t.Fatal(err)
		}
		return above
	})
	if err := in.RecordMark(ctx, consumer, p.Next, "h", uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	pruned, last := applied(2), applied(3)

	position(2)
	if n := prune(); n != 1 {
		t.Fatalf("retention deleted %d rows, want the one from before the mark", n)
	}
	m, err := src.SeenMark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Since != p.Next || m.Witness == "" {
		t.Fatalf("after a prune from before the mark: mark %d (%q), want %d with its witness", m.Since, m.Why, p.Next)
	}
	if got := seenSince(t, src, m.Since); !slices.Equal(got, sortedIDs(pruned, last)) {
		t.Fatalf("read from the mark: %v, want the two events after it", got)
	}

	position(3)
	if n := prune(); n != 1 {
		t.Fatalf("retention deleted %d rows, want the one changed after the mark", n)
	}
	if m, err := src.SeenMark(ctx); err != nil || m.Since != 0 || !strings.Contains(m.Why, "retention") {
		t.Fatalf("after a prune from after the mark: mark %d (%q, %v), want none for retention's delete", m.Since, m.Why, err)
	}
	// Control: from the mark regardless, the pruned event's audit row is
	// not read; whole, it is.
	if got := seenSince(t, src, p.Next); slices.Contains(got, pruned) {
		t.Fatalf("control: read from the mark after the prune: %v, want %s missing", got, pruned)
	}
	var whole []string
	if err := src.Seen(ctx, func(page []ops.SeenEvent) error {
		for _, e := range page {
			whole = append(whole, e.EventID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(whole, sortedIDs(before, pruned, last)) {
		t.Fatalf("read whole: %v, want every audit log row", whole)
	}
}

// seenSince is what src reads from since, by event ID.
func seenSince(t *testing.T, src ops.MarkedSource, since uint64) []string {
	t.Helper()
	var ids []string
	if err := src.SeenSince(context.Background(), since, func(page []ops.SeenEvent) error {
		for _, e := range page {
			ids = append(ids, e.EventID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

func sortedIDs(ids ...string) []string { return slices.Sorted(slices.Values(ids)) }
