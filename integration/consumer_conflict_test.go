package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// lockedBuffer is a log destination the test reads while consumers write.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) lines() []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestFailoverRevisionConflictsParkedNamedCounted is a ledger failover as the
// consumers see it, through the real middleware (Go batches and single
// receives), the memory sink and the relay: events the world saw (ghosts:
// applied by both consumers) are missing from the ledger, which then
// reissues their account revisions to new postings. Every new event at a
// ghost's revision is recorded as revision_conflict by both consumers (the
// balance projection parks the account; the audit log records it), counted
// in posthorn_consumer_messages_total{disposition="revision_conflict"},
// logged at ERROR with both event IDs, and named by reconcile with both IDs,
// never covered. Negative control: with the old rule
// (inboxstore.NewUnsafeRevisionOnly) the same run records no conflict, the
// projection absorbs every one as a duplicate and the audit log applies it,
// nothing is counted or logged, and reconcile names no conflict and counts
// the projection's duplicates as covered.
func TestFailoverRevisionConflictsParkedNamedCounted(t *testing.T) {
	t.Parallel()
	for _, oldRule := range []bool{false, true} {
		t.Run(fmt.Sprintf("old_rule=%v", oldRule), func(t *testing.T) {
			t.Parallel()
			failoverConflicts(t, oldRule)
		})
	}
}

func failoverConflicts(t *testing.T, oldRule bool) {
	ctx := context.Background()
	_, ledger := pgtest.Ledger(t)
	pool := smallConsumerPool(t)
	sink := memory.New(memory.Config{})
	t.Cleanup(func() { _ = sink.Close() })
	r := &opsRig{ledger: ledger, consumer: pool, store: ledgerstore.New(ledger, ledgerstore.Config{}),
		ops: opsstore.New(ledger), sink: sink}
	inbox := inboxstore.New(pool)
	if oldRule {
		inbox = inboxstore.NewUnsafeRevisionOnly(pool)
	}
	prom := prometheus.NewRegistry()
	logs := &lockedBuffer{}
	reg := newRegistry(t, pool, 10*time.Second, consumers.Config{
		Subscribers: func(string) (message.Subscriber, error) { return sink.Subscriber(), nil },
		Inbox:       inbox, Registerer: prom, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err := projection.Register(reg, core.TopicEvents); err != nil {
		t.Fatal(err)
	}
	if err := auditlog.Register(reg, core.TopicEvents); err != nil {
		t.Fatal(err)
	}
	runRegistry(t, reg, t.Errorf)

	before := r.deliver(t, 10)

	// The ghosts: two events per account past the ledger's revision, as
	// the lost primary published them, applied by both consumers.
	ghostAt := map[string]int64{} // account → the ghosts' top revision
	ghostIDs := map[string]bool{}
	var ghosts []core.Envelope
	for _, acc := range opsAccounts {
		var rev int64
		if err := ledger.QueryRow(ctx, `SELECT revision FROM account_revisions WHERE id = $1`, acc).Scan(&rev); err != nil {
			t.Fatal(err)
		}
		journal := uuid.Must(uuid.NewV7()).String()
		for k := int64(1); k <= 2; k++ {
			id := uuid.Must(uuid.NewV7()).String()
			payload, err := json.Marshal(core.AccountPosted{EventID: id, JournalID: journal, Account: acc, Revision: rev + k,
				Currency: "EUR", Delta: "777", PostedAt: time.Now().UTC()})
			if err != nil {
				t.Fatal(err)
			}
			ghosts = append(ghosts, core.Envelope{EventID: id, Kind: core.KindEvent, Type: core.TypeAccountPosted,
				AggregateType: core.AggregateAccount, AggregateID: acc, Revision: rev + k, JournalID: journal,
				OccurredAt: time.Now().UTC(), Topic: core.TopicEvents, Payload: payload})
			ghostIDs[id] = true
		}
		ghostAt[acc] = rev + 2
	}
	if err := sink.Publish(ctx, ghosts); err != nil {
		t.Fatal(err)
	}
	r.waitApplied(t, before+len(ghosts))

	// The new primary's postings reuse the ghosts' revisions.
	from := len(r.posted)
	after := r.post(t, 10)
	reissued := 0
	for _, p := range r.posted[from:] {
		for _, e := range p.Events {
			if e.Revision <= ghostAt[e.Account] {
				reissued++
			}
		}
	}
	r.relay(t, nil)
	total := int64(before + len(ghosts) + after)
	wait.For(t, opsWait, "every event has a disposition in both consumers", func() bool {
		for _, c := range []string{projection.Name, auditlog.Name} {
			var n int64
			for _, v := range counts(t, pool, c).Events {
				n += v
			}
			if n != total {
				return false
			}
		}
		return true
	})

	proj, audit := counts(t, pool, projection.Name), counts(t, pool, auditlog.Name)
	metric := func(c string) float64 {
		return promtest.Value(t, prom, "posthorn_consumer_messages_total", "consumer", c, "disposition", "revision_conflict")
	}
	var errorLines []map[string]any
	for _, l := range logs.lines() {
		if l["level"] == "ERROR" && l["msg"] == consumers.RevisionConflictLogMessage {
			errorLines = append(errorLines, l)
		}
	}
	rep := r.reconcile(t, nil)
	pr, ar := consumerReport(t, rep, projection.Name), consumerReport(t, rep, auditlog.Name)
	t.Logf("old rule %v: %d events reissued a ghost's revision; projection: %d revision_conflict, %d duplicate (absorbed silently), %d parked accounts; "+
		"audit log: %d revision_conflict, %d applied of %d; metric %v/%v; %d ERROR lines; reconcile clean %v, conflicts named %d/%d, unknown %d/%d, unproven %d/%d",
		oldRule, reissued, proj.Events[core.DispositionRevisionConflict], proj.Events[core.DispositionDuplicate], proj.ParkedAggregates,
		audit.Events[core.DispositionRevisionConflict], audit.Events[core.DispositionApplied], total, metric(projection.Name), metric(auditlog.Name),
		len(errorLines), rep.Clean, pr.Discrepancies.RevisionConflicts.Count, ar.Discrepancies.RevisionConflicts.Count,
		pr.Discrepancies.Unknown.Count, ar.Discrepancies.Unknown.Count, pr.Discrepancies.Unproven.Count, ar.Discrepancies.Unproven.Count)
	if reissued == 0 {
		t.Fatal("no new event reused a ghost's revision: the scenario tests nothing")
	}
	if rep.Clean || pr.Coverage != nil || ar.Coverage != nil {
		t.Fatalf("reconcile clean %v, coverage %+v %+v: the ghosts alone are unknown", rep.Clean, pr.Coverage, ar.Coverage)
	}

	if oldRule {
		// The control: the loss the rule of today names.
		if proj.Events[core.DispositionRevisionConflict] != 0 || proj.Events[core.DispositionDuplicate] != int64(reissued) ||
			audit.Events[core.DispositionApplied] != total || metric(projection.Name) != 0 || len(errorLines) != 0 ||
			pr.Discrepancies.RevisionConflicts.Count != 0 || pr.Discrepancies.Unproven.Count != 0 {
			t.Fatalf("control: the old rule did not absorb the %d reissued events silently: projection %+v, audit %+v, report %+v",
				reissued, proj, audit, pr.Discrepancies)
		}
		return
	}

	for _, c := range []struct {
		name   string
		counts inboxstore.Counts
	}{{projection.Name, proj}, {auditlog.Name, audit}} {
		if got := c.counts.Events[core.DispositionRevisionConflict]; got != int64(reissued) {
			t.Errorf("%s: %d revision_conflict, want %d", c.name, got, reissued)
		}
		if got := c.counts.Events[core.DispositionDuplicate]; got != 0 {
			t.Errorf("%s: %d duplicates absorbed, want none", c.name, got)
		}
		if got := metric(c.name); got != float64(reissued) {
			t.Errorf("%s: revision_conflict counter %v, want %d", c.name, got, reissued)
		}
	}
	if proj.ParkedAggregates != int64(len(opsAccounts)) {
		t.Errorf("projection parked %d accounts, want %d", proj.ParkedAggregates, len(opsAccounts))
	}
	if len(errorLines) != 2*reissued {
		t.Errorf("%d ERROR lines, want %d (one per consumer and conflict)", len(errorLines), 2*reissued)
	}
	for _, l := range errorLines {
		if !ghostIDs[fmt.Sprint(l["applied_event_id"])] || l["event_id"] == nil || l["aggregate_id"] == nil || l["revision"] == nil {
			t.Fatalf("ERROR line %v: want both event IDs (the applied one a ghost), the account and the revision", l)
		}
	}
	if pr.Discrepancies.RevisionConflicts.Count != int64(reissued) || ar.Discrepancies.RevisionConflicts.Count != int64(reissued) {
		t.Errorf("reconcile names %d and %d conflicts, want %d each", pr.Discrepancies.RevisionConflicts.Count,
			ar.Discrepancies.RevisionConflicts.Count, reissued)
	}
	for _, rc := range append(pr.Discrepancies.RevisionConflicts.Conflicts, ar.Discrepancies.RevisionConflicts.Conflicts...) {
		if !ghostIDs[rc.AppliedEventID] || ghostIDs[rc.EventID] || rc.Revision > ghostAt[rc.AggregateID] {
			t.Fatalf("conflict %+v: want the ledger's event against a ghost at a ghost's revision", rc)
		}
	}
	if pr.Discrepancies.Unknown.Count != int64(len(ghosts)) || pr.Discrepancies.Unproven.Count < int64(reissued) {
		t.Errorf("projection: unknown %d (want the %d ghosts), unproven %d (want at least the %d conflicts)",
			pr.Discrepancies.Unknown.Count, len(ghosts), pr.Discrepancies.Unproven.Count, reissued)
	}
}
