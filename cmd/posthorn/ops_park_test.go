package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/ops"
)

// opsCLIRig is a ledger and a consumer database driven through the binary,
// with the consumers' inbox fed directly (the memory sink of a separate
// process cannot reach them).
type opsCLIRig struct {
	t          *testing.T
	env        []string
	ledger     *pgxpool.Pool
	consumer   *pgxpool.Pool
	store      *ledgerstore.Store
	archiveDir string
	n          int
	lastID     int64 // outbox rows up to this id were delivered
}

func newOpsCLIRig(t *testing.T) *opsCLIRig {
	t.Helper()
	ledgerURL, ledger := pgtest.Ledger(t)
	consumerURL, consumer := pgtest.Consumer(t)
	r := &opsCLIRig{t: t, ledger: ledger, consumer: consumer, archiveDir: t.TempDir(),
		store: ledgerstore.New(ledger, ledgerstore.Config{})}
	r.env = []string{
		"POSTHORN_DATABASE__URL=" + ledgerURL,
		"POSTHORN_CONSUMER__DATABASE__URL=" + consumerURL,
		"POSTHORN_SINK__KIND=memory",
		"POSTHORN_ARCHIVE__DIR=" + r.archiveDir,
		"POSTHORN_CLEANUP__REPLAY_WINDOW=0s",
	}
	return r
}

// postings writes n postings between acc-0, acc-1 and acc-2 and returns
// their events, unrelayed.
func (r *opsCLIRig) postings(n int) []core.PostedEvent {
	r.t.Helper()
	var events []core.PostedEvent
	for range n {
		i := r.n
		r.n++
		p := core.Posting{Entries: []core.Entry{
			{Account: fmt.Sprintf("acc-%d", i%3), Direction: core.Debit, Amount: 10, Currency: "EUR"},
			{Account: fmt.Sprintf("acc-%d", (i+1)%3), Direction: core.Credit, Amount: 10, Currency: "EUR"},
		}}
		res, _, err := r.store.Post(context.Background(), fmt.Sprintf("park-%d", i), p)
		if err != nil {
			r.t.Fatal(err)
		}
		events = append(events, res.Events...)
	}
	return events
}

// maxID is the highest outbox id.
func (r *opsCLIRig) maxID() int64 {
	r.t.Helper()
	var id int64
	if err := r.ledger.QueryRow(context.Background(), `SELECT max(id) FROM outbox`).Scan(&id); err != nil {
		r.t.Fatal(err)
	}
	return id
}

// post writes n postings like postings and marks them relayed through
// `outbox resend` (the memory sink ACKs).
func (r *opsCLIRig) post(n int) {
	r.t.Helper()
	r.postings(n)
	r.run("outbox", "resend", "--from-id", "1", "--to-id", fmt.Sprint(r.maxID()))
}

// postCovered posts n postings, delivers them to both consumers and
// stops the test unless reconcile then exits 0, clean (coverage recorded).
func (r *opsCLIRig) postCovered(n int) {
	r.t.Helper()
	r.post(n)
	r.deliver("")
	if code, rep, stderr := r.reconcile(); code != 0 || !rep.Clean {
		r.t.Fatalf("reconcile after delivering %d postings: code %d, %+v, %s", n, code, rep, stderr)
	}
}

// run runs the binary with the rig's environment, stops the test unless
// it exits 0, and returns its stdout.
func (r *opsCLIRig) run(args ...string) string {
	r.t.Helper()
	code, stdout, stderr := runCLI(r.t, r.env, args...)
	if code != 0 {
		r.t.Fatalf("%s: code %d, %s %s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// deliver hands every new event to both consumers through the inbox;
// projection events of account park go to it as poison instead (the
// handler "failed for good"), and so the account parks.
func (r *opsCLIRig) deliver(park string) (parked []string) {
	r.t.Helper()
	ctx := context.Background()
	rows, err := opsstore.New(r.ledger).ReadRows(ctx, ops.RowFilter{EventsOnly: true, AfterID: r.lastID}, 1000)
	if err != nil {
		r.t.Fatal(err)
	}
	inbox := inboxstore.New(r.consumer)
	for _, row := range rows {
		r.lastID = max(r.lastID, row.ID)
		e := row.Envelope
		var out consumers.Outcome
		if e.AggregateID == park && len(parked) == 0 {
			out, err = inbox.ParkPoison(ctx, projection.Name, true, e, "handler failed: test poison")
		} else {
			out, err = inbox.Receive(ctx, projection.Name, true, e, projection.Handle)
		}
		if err != nil {
			r.t.Fatal(err)
		}
		if out.Disposition == core.DispositionParkedPoison || out.Disposition == core.DispositionParkedGap {
			parked = append(parked, e.EventID)
		}
		if _, err := inbox.Receive(ctx, auditlog.Name, false, e, auditlog.Handle); err != nil {
			r.t.Fatal(err)
		}
	}
	return parked
}

// reconcile runs `reconcile --json` with extra flags and decodes its
// report unless it could not run (exit 2).
func (r *opsCLIRig) reconcile(extra ...string) (int, ops.Report, string) {
	r.t.Helper()
	code, stdout, stderr := runCLI(r.t, r.env, append([]string{"reconcile", "--json"}, extra...)...)
	var rep ops.Report
	if code != 2 {
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			r.t.Fatalf("reconcile JSON: %v\n%s\n%s", err, stdout, stderr)
		}
	}
	return code, rep, stderr
}

func (r *opsCLIRig) outboxHas(eventID string) bool {
	r.t.Helper()
	var n int
	if err := r.ledger.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE event_id = $1`, eventID).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n > 0
}

// Parked is not covered: with an account parked at one
// consumer, reconcile exits 1 naming each parked event with the consumer
// and the reason, records no coverage for that consumer, and cleanup keeps
// the rows; after release and apply the same run is clean and cleanup may
// delete them.
func TestReconcileParkedIsNotCovered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsCLIRig(t)

	// A covered, archived start.
	r.postCovered(3)
	r.run("archive")

	// acc-1 parks at the projection.
	r.post(3)
	parked := r.deliver("acc-1")
	if len(parked) < 2 {
		t.Fatalf("parked %v, want the poison event and at least one behind it", parked)
	}
	code, rep, _ := r.reconcile()
	if code != 1 || rep.Clean {
		t.Fatalf("with acc-1 parked: code %d, clean %v; want exit 1", code, rep.Clean)
	}
	proj, audit := rep.Consumers[0], rep.Consumers[1]
	if proj.Name != projection.Name {
		proj, audit = audit, proj
	}
	if proj.Clean || proj.Coverage != nil || proj.Discrepancies.Unproven.Count != int64(len(parked)) {
		t.Fatalf("projection: clean %v coverage %+v unproven %+v; want %d unproven and no coverage", proj.Clean, proj.Coverage, proj.Discrepancies.Unproven, len(parked))
	}
	if !audit.Clean || audit.Coverage == nil {
		t.Fatalf("audit log: %+v, want clean and covered", audit)
	}
	waiting := map[string]ops.WaitingEvent{}
	for _, w := range proj.Discrepancies.Waiting {
		waiting[w.EventID] = w
	}
	if w := waiting[parked[0]]; w.Consumer != projection.Name || w.Disposition != "parked_poison" || !strings.Contains(w.Reason, "test poison") {
		t.Fatalf("poison event %s reported as %+v", parked[0], w)
	}
	for _, id := range parked[1:] {
		if w := waiting[id]; w.Disposition != "parked_gap" || !strings.Contains(w.Reason, "aggregate parked") {
			t.Fatalf("event %s behind the poison reported as %+v", id, w)
		}
	}
	// The human report names the event, the consumer and the reason.
	code, stdout, _ := runCLI(t, r.env, "reconcile", "--no-record")
	if code != 1 || !strings.Contains(stdout, parked[0]+"  "+projection.Name+"  parked_poison: handler failed: test poison") {
		t.Fatalf("human report, code %d:\n%s", code, stdout)
	}

	// Cleanup goes only as far as the projection's old coverage: the parked
	// rows stay.
	r.run("archive")
	if stdout := r.run("cleanup"); !strings.Contains(stdout, "deleted") {
		t.Fatalf("cleanup: %s", stdout)
	}
	for _, id := range parked {
		if !r.outboxHas(id) {
			t.Fatalf("cleanup deleted the parked event %s", id)
		}
	}

	// Release and apply: clean, covered, and cleanup takes the rest.
	r.run("consume", "release", "--consumer", projection.Name, "--account", "acc-1")
	outs, err := inboxstore.New(r.consumer).Drain(ctx, projection.Name, true, core.AggregateAccount, "acc-1", projection.Handle)
	if err != nil || len(outs) != len(parked) {
		t.Fatalf("drain after release: %d outcomes, %v; want %d", len(outs), err, len(parked))
	}
	if code, rep, stderr := r.reconcile(); code != 0 || !rep.Clean {
		t.Fatalf("after release and apply: code %d, %+v, %s", code, rep, stderr)
	}
	r.run("archive")
	if stdout := r.run("cleanup"); !strings.Contains(stdout, "deleted") {
		t.Fatalf("cleanup: %s", stdout)
	}
	for _, id := range parked {
		if r.outboxHas(id) {
			t.Fatalf("event %s still in the outbox after a clean run, archive and cleanup", id)
		}
	}
}

// Cleanup re-verifies the archive segments it relies on:
// a truncated, a deleted or a bit-flipped segment stops it with exit 1
// before anything is deleted, in a dry run too; the intact archive lets it
// delete.
func TestCleanupReverifiesArchiveSegments(t *testing.T) {
	t.Parallel()
	r := newOpsCLIRig(t)
	r.postCovered(4)
	r.run("archive")
	segs, _ := filepath.Glob(filepath.Join(r.archiveDir, "segment-*"))
	if len(segs) != 1 {
		t.Fatalf("segments %v, want one", segs)
	}
	seg := segs[0]
	intact, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	rows := func() int64 {
		var n int64
		if err := r.ledger.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := rows()
	for _, damage := range []struct {
		name string
		do   func() error
		want string
	}{
		{"truncated", func() error { return os.WriteFile(seg, intact[:len(intact)/2], 0o600) }, "SHA-256"},
		{"deleted", func() error { return os.Remove(seg) }, "no such file"},
		{"bit-flipped", func() error {
			b := bytes.Clone(intact)
			b[len(b)/3] ^= 0x01
			return os.WriteFile(seg, b, 0o600)
		}, "SHA-256"},
	} {
		if err := damage.do(); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"cleanup", "--dry-run"}, {"cleanup"}} {
			code, stdout, stderr := runCLI(t, r.env, args...)
			if code != 1 || !strings.Contains(stderr, "do not verify") || !strings.Contains(stderr, filepath.Base(seg)) ||
				!strings.Contains(stderr, damage.want) || !strings.Contains(stderr, "nothing deleted") {
				t.Fatalf("%s segment, %v: code %d, %s %s", damage.name, args, code, stdout, stderr)
			}
			if n := rows(); n != before {
				t.Fatalf("%s segment, %v: %d outbox rows left of %d", damage.name, args, n, before)
			}
		}
		if err := os.WriteFile(seg, intact, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if code, stdout, stderr := runCLI(t, r.env, "cleanup"); code != 0 || !strings.Contains(stdout, fmt.Sprintf("deleted %d rows", before)) {
		t.Fatalf("cleanup over the intact archive: code %d, %s %s", code, stdout, stderr)
	}
}

// `posthorn outbox release` lifts the park of a command journal and of an
// aggregate a team publishes, not only of an account, and `outbox status`
// names the command that does it for each type.
func TestOutboxReleaseParkedCommandJournal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newOpsCLIRig(t)
	store := relaystore.New(r.ledger)
	const journal = "0190c0de-0000-7000-8000-00000000c0de"
	for _, p := range []core.ParkedAggregate{
		{AggregateType: core.AggregateJournal, AggregateID: journal, EventID: "0190c0de-0000-7000-8000-000000000001", Reason: "unroutable"},
		{AggregateType: core.AggregateAccount, AggregateID: "acc-9", EventID: "0190c0de-0000-7000-8000-000000000002", Reason: "too large"},
		{AggregateType: "wallet", AggregateID: "w-1", EventID: "0190c0de-0000-7000-8000-000000000003", Reason: "too large"},
	} {
		if _, err := store.Park(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, stderr := runCLI(t, r.env, "outbox", "release"); code == 0 || !strings.Contains(stderr, "--journal") {
		t.Fatalf("release without an aggregate: code %d, %s", code, stderr)
	}
	if code, _, stderr := runCLI(t, r.env, "outbox", "release", "--account", "acc-9", "--journal", journal); code == 0 || !strings.Contains(stderr, "exactly one") {
		t.Fatalf("release of two: code %d, %s", code, stderr)
	}
	if code, stdout, stderr := runCLI(t, r.env, "outbox", "release", "--journal", journal); code != 0 || !strings.Contains(stdout, "journal "+journal+" released") {
		t.Fatalf("release --journal: code %d, %s %s", code, stdout, stderr)
	}
	r.run("outbox", "release", "--account", "acc-9")
	if code, stdout, stderr := runCLI(t, r.env, "outbox", "status"); code != 0 || !strings.Contains(stdout, "posthorn outbox release --aggregate-type TYPE --aggregate-id ID") {
		t.Fatalf("outbox status names no release command for a wallet: code %d, %s %s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, r.env, "outbox", "release", "--account", "w-1"); code == 0 || !strings.Contains(stderr, "not parked") {
		t.Fatalf("release of a wallet as an account: code %d, %s %s", code, stdout, stderr)
	}
	r.run("outbox", "release", "--aggregate-type", "wallet", "--aggregate-id", "w-1")
	if left, err := store.Parked(ctx); err != nil || len(left) != 0 {
		t.Fatalf("still parked: %+v %v", left, err)
	}
	if code, _, stderr := runCLI(t, r.env, "outbox", "release", "--journal", journal); code == 0 || !strings.Contains(stderr, "not parked") {
		t.Fatalf("release of a journal not parked: code %d, %s", code, stderr)
	}
}
