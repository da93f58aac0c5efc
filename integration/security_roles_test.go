package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/fsarchive"
	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
	"github.com/posthorn/posthorn/relay"
)

// TestSecurityEveryComponentUnderItsRole runs the whole life of a posting
// with each component connected as a LOGIN role of its group only: the
// write path as posthorn_api, the relay, outbox status, resend and replay as
// posthorn_relay, the example consumers as posthorn_consumer, reconcile as
// posthorn_reconciler (ledger and consumer database), archive and cleanup
// as posthorn_maintainer. Every step must succeed under those grants and
// end where the same steps end under the owner (the other ops tests): all
// events applied once, repeats absorbed, reconcile clean, covered rows
// archived and deleted. What each role is refused is shown in
// adapters/postgres/privileges_test.go.
func TestSecurityEveryComponentUnderItsRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ledgerURL, ledgerOwner := roletest.Ledger(t)
	consumerURL, consumerOwner := roletest.Consumer(t)
	as := func(url string, r postgres.Role) *opsstore.Store {
		return opsstore.New(roletest.As(t, url, r))
	}
	apiPool := roletest.As(t, ledgerURL, postgres.RoleAPI)
	relayPool := roletest.As(t, ledgerURL, postgres.RoleRelay)
	consPool := roletest.Pool(t, roletest.Consumers(t, consumerURL, "", projection.Name, auditlog.Name))
	reconciler := as(ledgerURL, postgres.RoleReconciler)
	recInbox := inboxstore.New(roletest.As(t, consumerURL, postgres.RoleReconciler))
	maintainer := as(ledgerURL, postgres.RoleMaintainer)
	relayOps := opsstore.New(relayPool)

	sink := memory.New(memory.Config{})
	t.Cleanup(func() { _ = sink.Close() })
	startOpsConsumers(t, sink, consPool)

	// Write path as posthorn_api.
	store := ledgerstore.New(apiPool, ledgerstore.Config{})
	events := 0
	var last core.PostingResult
	for i := range 30 {
		p := core.Posting{Entries: []core.Entry{
			{Account: fmt.Sprintf("acc-%d", i%5), Direction: core.Debit, Amount: int64(10 + i), Currency: "EUR"},
			{Account: fmt.Sprintf("acc-%d", 5+i%3), Direction: core.Credit, Amount: int64(10 + i), Currency: "EUR"},
		}}
		if i%7 == 0 {
			p.Commands = []core.CommandSpec{{Type: "payouts.payout.execute", Payload: []byte(`{}`)}}
		}
		res, _, err := store.Post(ctx, fmt.Sprintf("roles-%d", i), p)
		if err != nil {
			t.Fatalf("post as posthorn_api: %v", err)
		}
		events += len(res.Events)
		last = res
	}

	// Relay as posthorn_relay.
	rel := startRelay(t, relayPool, sink, relay.Settings{
		Owner: "roles-relay", PollInterval: 50 * time.Millisecond, LeaseTTL: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	wait.For(t, opsWait, "outbox relayed by posthorn_relay", func() bool { return relaytest.Unrelayed(t, ledgerOwner) == 0 })
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rel.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	waitAppliedOn(t, consumerOwner, events)

	// outbox status, resend and replay as posthorn_relay.
	if st, err := relaystore.New(relayPool).Status(ctx); err != nil || st.Backlog != 0 {
		t.Fatalf("outbox status as posthorn_relay: %+v %v", st, err)
	}
	if _, _, err := relayOps.Uncertain(ctx, 10); err != nil {
		t.Fatalf("uncertain rows as posthorn_relay: %v", err)
	}
	if res, err := ops.Resend(ctx, ops.ResendConfig{Ledger: relayOps, Sink: sink, EventIDs: []string{last.Events[0].EventID}}); err != nil || res.Sent != 1 {
		t.Fatalf("resend as posthorn_relay: %+v %v", res, err)
	}
	if res, err := ops.Replay(ctx, ops.ReplayConfig{Ledger: relayOps, Sink: sink, Name: "roles"}); err != nil || res.Sent != int64(events) {
		t.Fatalf("replay as posthorn_relay: %+v %v (want %d events)", res, err, events)
	}
	wait.For(t, opsWait, "repeats absorbed", func() bool {
		p, a := counts(t, consumerOwner, projection.Name), counts(t, consumerOwner, auditlog.Name)
		return p.DuplicatesAbsorbed == int64(events+1) && a.DuplicatesAbsorbed == int64(events+1)
	})

	// Reconcile as posthorn_reconciler, on both databases.
	rep, err := ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: reconciler, Record: true, Consumers: []ops.ConsumerSource{
		{Name: projection.Name, Reader: ops.InboxReader{Inbox: recInbox, Consumer: projection.Name}},
		{Name: auditlog.Name, Reader: ops.InboxReader{Inbox: recInbox, Consumer: auditlog.Name}},
	}})
	if err != nil || !rep.Clean {
		t.Fatalf("reconcile as posthorn_reconciler: %+v %v", rep, err)
	}
	for _, c := range rep.Consumers {
		if c.Pass == nil || c.Pass.RecordedMark == 0 {
			t.Fatalf("%s: no mark recorded as posthorn_reconciler: %+v", c.Name, c.Pass)
		}
	}

	// Archive and cleanup as posthorn_maintainer.
	archive, err := fsarchive.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	required := []string{projection.Name, auditlog.Name}
	ares, err := ops.Archive(ctx, ops.ArchiveConfig{Ledger: maintainer, Archive: archive, Required: required})
	if err != nil || ares.Rows == 0 {
		t.Fatalf("archive as posthorn_maintainer: %+v %v", ares, err)
	}
	if v, err := ops.VerifyArchive(ctx, maintainer, archive); err != nil || len(v.Problems) != 0 {
		t.Fatalf("verify as posthorn_maintainer: %+v %v", v, err)
	}
	cres, err := ops.Cleanup(ctx, ops.CleanupConfig{Ledger: maintainer, Archive: archive, Required: required, ReplayWindow: 0})
	if err != nil || cres.Deleted != ares.Rows {
		t.Fatalf("cleanup as posthorn_maintainer: %+v %v (archived %d)", cres, err, ares.Rows)
	}
	// Reconcile after cleanup still works for the reconciler (it reads the floor).
	if rep, err := ops.Reconcile(ctx, ops.ReconcileConfig{Ledger: reconciler, Archive: archive, Consumers: []ops.ConsumerSource{
		{Name: projection.Name, Reader: ops.InboxReader{Inbox: recInbox, Consumer: projection.Name}},
	}}); err != nil || !rep.Clean || rep.Consumers[0].Pass.SinceMark == 0 {
		t.Fatalf("reconcile after cleanup as posthorn_reconciler: %+v %v", rep, err)
	}
}

func waitAppliedOn(t *testing.T, consumer *pgxpool.Pool, events int) {
	t.Helper()
	wait.For(t, opsWait, fmt.Sprintf("both consumers applied %d events", events), func() bool {
		p, a := counts(t, consumer, projection.Name), counts(t, consumer, auditlog.Name)
		return p.Events[core.DispositionApplied] == int64(events) && a.Events[core.DispositionApplied] == int64(events)
	})
}

// TestSecurityMigrateRolesCommand runs `posthorn migrate --roles
// --create-logins` as operators do: twice (idempotent), with a password
// from the environment that reaches the server only as a SCRAM verifier
// and is never printed; then the consumer schema's grants.
func TestSecurityMigrateRolesCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := posthornBin(t)
	ledgerURL, consumerURL := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	password := randomSecret("S3cret-login-")
	run := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"migrate"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	env := []string{"POSTHORN_DATABASE__URL=" + ledgerURL, "POSTHORN_ROLE_PASSWORD_API=" + password}
	for i := range 2 {
		out, err := run(env, "--roles", "--create-logins")
		if err != nil || !strings.Contains(out, "roles and grants on the ledger schema are up to date") ||
			!strings.Contains(out, "login role posthorn_api_login (member of posthorn_api) with the password from POSTHORN_ROLE_PASSWORD_API") {
			t.Fatalf("run %d: %v\n%s", i+1, err, out)
		}
		if strings.Contains(out, password) {
			t.Fatalf("the password is printed:\n%s", out)
		}
	}
	admin, err := pgx.Connect(ctx, pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var canLogin, member bool
	var verifier string
	if err := admin.QueryRow(ctx, `SELECT rolcanlogin, pg_has_role(oid, 'posthorn_api', 'MEMBER'), rolpassword FROM pg_authid WHERE rolname = 'posthorn_api_login'`).
		Scan(&canLogin, &member, &verifier); err != nil {
		t.Fatal(err)
	}
	if !canLogin || !member || !strings.HasPrefix(verifier, "SCRAM-SHA-256$4096:") || strings.Contains(verifier, password) {
		t.Fatalf("posthorn_api_login: login %v, member %v, stored %q", canLogin, member, verifier)
	}
	consEnv := []string{"POSTHORN_CONSUMER__DATABASE__URL=" + consumerURL}
	if out, err := run(consEnv, "--consumer", "--roles"); err != nil ||
		!strings.Contains(out, "roles and grants on the consumer schema are up to date") {
		t.Fatalf("consumer roles: %v\n%s", err, out)
	}
	// A team's consumer gets a role of its own: its login records its own
	// dispositions and cannot record balance-projection's.
	out, err := run(consEnv, "--consumer", "--roles", "--register-consumer", "invoices", "--create-logins")
	for _, want := range []string{
		"consumer invoices answers as role posthorn_consumer_invoices",
		"login role posthorn_consumer_login (member of posthorn_consumer_audit_log, posthorn_consumer_balance_projection)",
		"login role posthorn_consumer_invoices_login (member of posthorn_consumer_invoices)",
	} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("--register-consumer invoices: %v, want %q in\n%s", err, want, out)
		}
	}
	u, err := neturl.Parse(consumerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User("posthorn_consumer_invoices_login")
	invoices := pgtest.SmallPool(t, u.String(), 1)
	h, _ := json.Marshal(core.Envelope{EventID: "0190a000-0000-7000-8000-0000000000a1", Kind: core.KindEvent, Type: "invoice.issued",
		AggregateType: "invoice", AggregateID: "inv-1", Revision: 1, OccurredAt: time.Now()}.WireHeaders())
	for _, c := range []struct {
		consumer string
		refused  bool
	}{{"invoices", false}, {"balance-projection", true}} {
		_, err := invoices.Exec(ctx, `SELECT posthorn_inbox_receive($1, $2::text::jsonb)`, c.consumer, string(h))
		if refused := roletest.Denied(err); refused != c.refused || (!c.refused && err != nil) {
			t.Fatalf("invoices' login receiving as %s: %v, want refused %v", c.consumer, err, c.refused)
		}
	}
	for _, bad := range []struct{ args []string }{
		{[]string{"--consumer", "--register-consumer", "invoices"}},
		{[]string{"--consumer", "--roles", "--register-consumer", strings.Repeat("x", 46)}},
	} {
		if out, err := run(consEnv, bad.args...); err == nil || !strings.Contains(out, "--register-consumer") {
			t.Fatalf("%v: %v, want an error naming --register-consumer\n%s", bad.args, err, out)
		}
	}
	if out, err := run(env, "--create-logins"); err == nil || !strings.Contains(out, "--create-logins needs --roles") {
		t.Fatalf("--create-logins alone: %v\n%s", err, out)
	}
}
