package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/ops"
)

// runbook is one ledger failover handled as docs/operations.md says, with
// every component a process: the API, one relay and one `posthorn consume`
// (both example consumers) on a multi-host ledger URL, a primary with an
// asynchronous standby, and `posthorn failover check` and `recover`.
type runbook struct {
	mode string // relay.mode: polling or cdc
	// required sets relay.standby_flush: required (the standby must hold
	// what the relay publishes).
	required bool
	// kafka is a real Apache Kafka cluster; nil runs the dev broker (kfake).
	kafka *kafkacluster.Cluster
	// sources: "sink" (the Kafka topic alone: only balance-projection is
	// configured, whose inbox keeps no payloads), "audit" (the consumers'
	// databases alone, --sink-since 0) or "both".
	sources string
	// loseOneKey deletes one lost posting's credit from the audit log
	// before the check (sources "audit"): that posting cannot be rebuilt,
	// and a client's retry of its key must be refused.
	loseOneKey bool
	// asBefore recovers as the previous release did, instead of `posthorn
	// failover recover`: the negative control.
	asBefore bool
}

func (rb runbook) String() string {
	s := fmt.Sprintf("%s/%s/standby_flush=%v", rb.mode, rb.sources, rb.required)
	if rb.kafka != nil {
		s += "/apache-kafka"
	} else {
		s += "/kfake"
	}
	if rb.loseOneKey {
		s += "/one-key-lost"
	}
	if rb.asBefore {
		s += "/as-before"
	}
	return s
}

// runbookResult is what the runbook left: the figures.
type runbookResult struct {
	lostEvents, recoverExit     int
	recoverOut                  string
	batch3Delivered             int
	batch3Took                  time.Duration
	relayParked, consumerParked int
	reconcileExit               int
	balancesMatch, accounts     int
	retryStatus                 int
	retryJournal, wantJournal   string
	journalsWritten             int
	lostKeyStatus               int
	lostKeyJournal, lostJournal string
}

func (r runbookResult) String() string {
	s := fmt.Sprintf("%d events lost; recover exit %d; batch 3: %d of its 40 events applied by both consumers within %v; parked: relay %d, consumers %d; reconcile exit %d; balances match on %d of %d accounts; a client's retry of a lost posting's key: %d, journal %s (the posting's: %s), %d journals written",
		r.lostEvents, r.recoverExit, r.batch3Delivered, r.batch3Took.Round(100*time.Millisecond), r.relayParked, r.consumerParked,
		r.reconcileExit, r.balancesMatch, r.accounts, r.retryStatus, r.retryJournal, r.wantJournal, r.journalsWritten)
	if r.lostJournal != "" {
		s += fmt.Sprintf("; the retry of the key of the posting that could not be rebuilt: %d naming %s (want %s)", r.lostKeyStatus, r.lostKeyJournal, r.lostJournal)
	}
	return s
}

const runbookAccounts = 8

// rbPosting is a transfer of 100+i from acc-(i mod 8) to the next account,
// as a client sends it.
func rbPosting(i int) string {
	return fmt.Sprintf(`{"entries":[{"account":"acc-%d","direction":"debit","amount":"%d","currency":"EUR"},`+
		`{"account":"acc-%d","direction":"credit","amount":"%d","currency":"EUR"}]}`,
		i%runbookAccounts, 100+i, (i+1)%runbookAccounts, 100+i)
}

// rbPost sends one posting and returns the status and the journal ID of
// the answer (or the problem's journal_id).
func rbPost(t *testing.T, apiURL, key, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, apiURL+"/v1/postings", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err.Error()
	}
	defer res.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(res.Body)
	var out struct {
		JournalID string `json:"journal_id"`
	}
	_ = json.Unmarshal(b.Bytes(), &out)
	return res.StatusCode, out.JournalID, b.String()
}

// rbPostBatch posts postings from..to-1 under keys prefix-i, retrying a
// request that got no 200/201 (a client does, with the same key), and
// returns each journal.
func rbPostBatch(t *testing.T, apiURL, prefix string, from, to int) []string {
	t.Helper()
	var journals []string
	for i := from; i < to; i++ {
		key := fmt.Sprintf("%s-%d", prefix, i)
		var code int
		var journal, body string
		wait.For(t, 30*time.Second, "posting "+key+" to be taken", func() bool {
			code, journal, body = rbPost(t, apiURL, key, rbPosting(i))
			return code == http.StatusCreated || code == http.StatusOK
		})
		if code != http.StatusCreated {
			t.Fatalf("posting %s: %d %s, want 201", key, code, body)
		}
		journals = append(journals, journal)
	}
	return journals
}

// applied counts the events each example consumer applied.
func applied(t *testing.T, consumer *pgxpool.Pool) (projected, audited int64) {
	t.Helper()
	if err := consumer.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE consumer = $1), count(*) FILTER (WHERE consumer = $2)
FROM consumer_inbox WHERE disposition = 'applied'`, projection.Name, auditlog.Name).Scan(&projected, &audited); err != nil {
		t.Fatal(err)
	}
	return projected, audited
}

// waitApplied waits until both consumers applied n events.
func waitApplied(t *testing.T, consumer *pgxpool.Pool, n int64) {
	t.Helper()
	wait.For(t, 60*time.Second, fmt.Sprintf("both consumers to apply %d events", n), func() bool {
		p, a := applied(t, consumer)
		return p == n && a == n
	})
}

// runOps runs one posthorn command to its end and returns its exit code
// and output.
func runOps(t *testing.T, bin string, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("posthorn %v: %v\n%s", args, err, out)
	}
	return code, string(out)
}

// failoverRunbook plays the scenario: batch 1 (5 postings) is
// relayed and applied with the standby streaming; the standby is cut off;
// batch 2 (20 postings, 40 events) commits on the primary and, unless
// standby_flush holds it, is relayed and applied; the primary is SIGKILLed
// and the standby promoted; a posting is refused (503); `failover check`
// names what is lost and `failover recover` rebuilds it (or the control
// recovers as before); a client retries a batch-2 posting; batch 3 (20
// more postings, 40 events, on the same accounts) must reach both
// consumers; reconcile and the balances are compared.
func failoverRunbook(t *testing.T, rb runbook, sinceStart time.Time) runbookResult {
	t.Helper()
	ctx := context.Background()
	bin := posthornBin(t)
	dir := t.TempDir()
	f := relaytest.NewFailover(t, pgcluster.Options{Logical: rb.mode == "cdc"})
	ledgerURL := fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/ledger?sslmode=disable&target_session_attrs=read-write",
		f.Primary.User(), f.Primary.Port(), f.Standby.Port())
	consumerURL, consumer := pgtest.Consumer(t)
	relayEnv := []string{"POSTHORN_RELAY__MODE=" + rb.mode, "POSTHORN_RELAY__LEASE_TTL=2s"}
	if rb.required {
		relayEnv = append(relayEnv, "POSTHORN_RELAY__STANDBY_FLUSH=required", "POSTHORN_RELAY__STANDBY_NAMES="+relaytest.StandbyName)
	}
	s, err := faultkit.StartSystem(ctx, faultkit.SystemConfig{Bin: bin, LedgerURL: ledgerURL, ConsumerURL: consumerURL, Dir: dir,
		Relays: 1, Consumers: 1, Kafka: rb.kafka, RelayEnv: relayEnv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range s.Procs() {
				t.Logf("%s log:\n%s", p.LogPath(), faultkit.Tail(p.LogPath(), 40))
			}
		}
	})

	rbPostBatch(t, s.APIURL, "b1", 0, 5)
	waitApplied(t, consumer, 10)
	// Batch 1 is whole on the standby before it is cut off: its markers
	// too, which may come after the consumers applied it (a produce whose
	// ACK timed out is sent again first). A standby without them would
	// promote batch 1 as unrelayed, and the CDC relay would hold it on the
	// unaccepted history instead of streaming.
	wait.For(t, 30*time.Second, "batch 1 marked", func() bool { return relaytest.Unrelayed(t, f.Pool) == 0 })
	marked := pgtest.Column[string](t, f.Pool, `SELECT pg_current_wal_lsn()::text`)[0]
	wait.For(t, 30*time.Second, "the markers replayed on the standby", func() bool {
		return pgtest.Column[bool](t, f.Pool,
			`SELECT coalesce(bool_and(replay_lsn >= $1::pg_lsn), false) FROM pg_stat_replication`, marked)[0]
	})
	if err := f.Standby.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	lostJournals := rbPostBatch(t, s.APIURL, "b2", 5, 25)
	if rb.required {
		// The relay holds batch 2 for the standby that is gone.
		wait.For(t, 30*time.Second, "the relay to hold for the standby", func() bool {
			return relaytest.Unrelayed(t, f.Pool) == 40
		})
	} else {
		waitApplied(t, consumer, 50)
	}
	f.KillPrimaryAndPromote(t)
	newPrimary := pgtest.SmallPool(t, f.Standby.URL("ledger"), 2)
	if rb.required {
		// The runbook attaches a standby to the new primary: a relay that
		// must publish only what a standby holds waits for one.
		again, err := f.Standby.StartStandby(ctx, relaytest.StandbyName)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = again.Stop() })
	}
	if rb.mode == "cdc" {
		// The relay follows the multi-host URL and streams from a new slot
		// on the new primary before the recovery: the rows it re-commits
		// are in the stream.
		wait.For(t, 60*time.Second, "the CDC relay to stream from a slot on the new primary", func() bool {
			return pgtest.Column[int64](t, newPrimary, `SELECT count(*) FROM pg_replication_slots WHERE active AND slot_type = 'logical'`)[0] == 1
		})
	}
	wait.For(t, 30*time.Second, "the API to refuse postings on the unaccepted history", func() bool {
		code, _, body := rbPost(t, s.APIURL, "b3-refused", rbPosting(25))
		if code == http.StatusCreated {
			t.Fatalf("the API took a posting on the unaccepted history: %s", body)
		}
		return code == http.StatusServiceUnavailable && strings.Contains(body, "ledger-history-not-accepted")
	})

	if rb.loseOneKey {
		// The audit log lacks the credit of batch 2's first posting: no
		// source holds that posting whole.
		if _, err := consumer.Exec(ctx, `DELETE FROM audit_log WHERE journal_id = $1 AND (payload->>'delta')::bigint > 0`, lostJournals[0]); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"POSTHORN_DATABASE__URL=" + f.Standby.URL("ledger"), "POSTHORN_CONSUMER__DATABASE__URL=" + consumerURL,
		"POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=" + strings.Join(s.Brokers, ","), "POSTHORN_LOG__LEVEL=warn"}
	flags := []string{"--sink-since", time.Since(sinceStart).Round(time.Second).String()}
	switch rb.sources {
	case "audit":
		flags = []string{"--sink-since", "0"}
	case "sink":
		cfg := filepath.Join(dir, "projection-only.yaml")
		if err := os.WriteFile(cfg, fmt.Appendf(nil, "reconcile:\n  consumers:\n    - name: %s\n      database_url: %q\n", projection.Name, consumerURL), 0o600); err != nil {
			t.Fatal(err)
		}
		flags = append(flags, "--config", cfg)
	}
	var res runbookResult
	code, out := runOps(t, bin, env, append([]string{"failover", "check", "--json"}, flags...)...)
	var check ops.FailoverReport
	if err := json.Unmarshal([]byte(out), &check); err != nil || code != 1 {
		t.Fatalf("failover check: exit %d (want 1: the history is not accepted), %v\n%s", code, err, out)
	}
	res.lostEvents = len(check.Lost)
	if rb.asBefore {
		recoverAsBefore(t, newPrimary, consumer, rb, s.Brokers, sinceStart)
	} else {
		res.recoverExit, res.recoverOut = runOps(t, bin, env, append([]string{"failover", "recover", "--settle", "20s"}, flags...)...)
		t.Logf("posthorn failover recover (exit %d):\n%s", res.recoverExit, res.recoverOut)
	}
	journals := func() int { return int(pgtest.Column[int64](t, newPrimary, `SELECT count(*) FROM journals`)[0]) }

	// A client that was answered 201 for a batch-2 posting retries it.
	retry := 1
	if rb.loseOneKey {
		retry = 2 // the first was made unrebuildable
	}
	key := fmt.Sprintf("b2-%d", 5+retry)
	before := journals()
	wait.For(t, 30*time.Second, "the API to answer the retry", func() bool {
		res.retryStatus, res.retryJournal, _ = rbPost(t, s.APIURL, key, rbPosting(5+retry))
		return res.retryStatus != http.StatusServiceUnavailable && res.retryStatus != 0
	})
	res.wantJournal = lostJournals[retry]
	res.journalsWritten = journals() - before
	if rb.loseOneKey {
		res.lostJournal = lostJournals[0]
		var body string
		res.lostKeyStatus, _, body = rbPost(t, s.APIURL, "b2-5", rbPosting(5))
		var p struct {
			Type      string `json:"type"`
			JournalID string `json:"journal_id"`
		}
		_ = json.Unmarshal([]byte(body), &p)
		res.lostKeyJournal = p.JournalID
		if !strings.HasSuffix(p.Type, "/idempotency-key-lost-in-failover") {
			res.lostKeyJournal = "(" + body + ")"
		}
	}

	// Batch 3 on the same accounts: the relay and the consumers run by
	// themselves again.
	began := time.Now()
	rbPostBatch(t, s.APIURL, "b3", 25, 45)
	want := int64(10 + 40 + 40)
	if rb.required {
		want = 10 + 40 // batch 2 was never published; its retry below posts again
		if res.journalsWritten == 1 {
			want += 2
		}
	}
	patience := 60 * time.Second
	if rb.asBefore {
		patience = 30 * time.Second // the control is expected to stall
	}
	wait.Until(patience, func() (bool, string) {
		p, a := applied(t, consumer)
		return p >= want && a >= want && relaytest.Unrelayed(t, newPrimary) == 0, ""
	})
	res.batch3Took = time.Since(began)
	p, a := applied(t, consumer)
	res.batch3Delivered = int(max(0, min(p, a)-(want-40)))
	res.relayParked = int(pgtest.Column[int64](t, newPrimary, `SELECT count(*) FROM relay_parked`)[0])
	res.consumerParked = int(pgtest.Column[int64](t, consumer, `SELECT count(*) FROM consumer_positions WHERE parked`)[0])
	res.reconcileExit, out = runOps(t, bin, []string{"POSTHORN_DATABASE__URL=" + f.Standby.URL("ledger"),
		"POSTHORN_CONSUMER__DATABASE__URL=" + consumerURL, "POSTHORN_LOG__LEVEL=warn"}, "reconcile", "--settle", "10s")
	if res.reconcileExit != 0 {
		t.Logf("posthorn reconcile (exit %d):\n%s", res.reconcileExit, out)
	}
	ledger := map[string]bool{}
	for _, b := range pgtest.Column[string](t, newPrimary, `SELECT account_id || ' ' || currency || ' ' || balance FROM account_balances`) {
		ledger[b] = true
	}
	res.accounts = len(ledger)
	for _, b := range pgtest.Column[string](t, consumer, `SELECT account || ' ' || currency || ' ' || balance FROM projection_balances`) {
		if ledger[b] {
			res.balancesMatch++
		}
	}
	return res
}

// recoverAsBefore is the previous release's `failover recover`: the same
// check, then each rebuilt posting re-committed through the unchecked
// function with every header but the contract's (a Kafka record's
// transport headers included), and no idempotency key recorded.
func recoverAsBefore(t *testing.T, ledger, consumer *pgxpool.Pool, rb runbook, brokers []string, since time.Time) {
	t.Helper()
	ctx := context.Background()
	sources := []ops.SeenSource{opsstore.InboxSeen{Pool: consumer, Consumer: projection.Name}}
	if rb.sources != "sink" {
		sources = append(sources, opsstore.InboxSeen{Pool: consumer, Consumer: auditlog.Name}, opsstore.AuditLogSeen{Pool: consumer, Consumer: auditlog.Name})
	}
	if rb.sources != "audit" {
		sources = append(sources, kafka.TopicSeen{Config: kafka.Config{Brokers: brokers}, Topics: []string{core.TopicEvents}, Since: since})
	}
	rep, err := ops.FailoverCheck(ctx, ops.FailoverConfig{Ledger: opsstore.NewFailoverStore(ledger), Sources: sources, Margin: 1000})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, ledger, func(tx pgx.Tx) error {
		m := rep.Plan.Moves
		types, ids, revs := make([]string, len(m)), make([]string, len(m)), make([]int64, len(m))
		for i, mv := range m {
			types[i], ids[i], revs[i] = mv.AggregateType, mv.AggregateID, mv.Seen
		}
		if _, err := tx.Exec(ctx, `SELECT posthorn.failover_advance($1, $2, $3, $4, $5)`,
			rep.Plan.OutboxIDPast, rep.Plan.JournalSequencePast, types, ids, revs); err != nil {
			return err
		}
		for _, j := range rep.Plan.Rebuild {
			for i, l := range j.Lines {
				h := map[string]string{}
				for k, v := range l.Headers {
					if k != core.HeaderEventID && k != core.HeaderKind && k != core.HeaderType && k != core.HeaderAggregateType &&
						k != core.HeaderAggregateID && k != core.HeaderRevision && k != core.HeaderJournalID && k != core.HeaderOccurredAt &&
						k != core.HeaderReplay && k != core.HeaderLedgerTimeline && k != core.HeaderSchemaVersion && k != core.HeaderContentType {
						h[k] = v
					}
				}
				j.Lines[i].Headers = h
			}
			doc, err := json.Marshal(j.Lines)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT posthorn.failover_recommit($1::text::uuid, $2, $3::jsonb)`, j.JournalID, j.PostedAt, string(doc)); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `SELECT posthorn.failover_accept('as before')`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFailoverRunbookAsProcesses: a ledger failover handled by the
// documented runbook leaves the system running by itself again, in both
// relay modes, with standby_flush off and on, whatever source the
// recovery reads (the dev broker's topic, the audit log, or both): batch
// 3 reaches both consumers within seconds, no account is parked, reconcile
// is clean and the projection equals the ledger; a client's retry of a
// lost posting's key answers 200 with its journal and writes nothing (with
// standby_flush, where the world never saw the posting, it posts it once);
// the retry of a key whose posting could not be rebuilt is refused with
// 409 naming the journal, and recover exits 1 saying so. Negative control:
// the previous recovery in CDC mode leaves the relay parked on the header
// it copied (batch 3 undelivered) and the retry posts the money twice.
func TestFailoverRunbookAsProcesses(t *testing.T) {
	t.Parallel()
	for _, rb := range []runbook{
		{mode: "polling", sources: "both"},
		{mode: "cdc", sources: "audit", loseOneKey: true},
		{mode: "polling", sources: "audit", required: true},
		{mode: "cdc", sources: "both", required: true},
		{mode: "cdc", sources: "sink", asBefore: true},
	} {
		t.Run(rb.String(), func(t *testing.T) {
			t.Parallel()
			res := failoverRunbook(t, rb, time.Now())
			t.Logf("%s: %s", rb, res)
			checkRunbook(t, rb, res)
		})
	}
}

// TestFailoverRunbookApacheKafka is the runbook with a real three-node
// Apache Kafka cluster as the sink and the recovery's only source, in both
// relay modes, one after the other on one cluster (each check reads the
// topic only since its own run began).
func TestFailoverRunbookApacheKafka(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a three-node Apache Kafka cluster")
	}
	k := kafkacluster.Start(t, 3)
	for _, mode := range []string{"cdc", "polling"} {
		rb := runbook{mode: mode, sources: "sink", kafka: k}
		t.Run(rb.String(), func(t *testing.T) {
			res := failoverRunbook(t, rb, time.Now())
			t.Logf("%s: %s", rb, res)
			checkRunbook(t, rb, res)
		})
	}
}

// checkRunbook holds a run to the runbook's promise, or its control to
// the breach.
func checkRunbook(t *testing.T, rb runbook, res runbookResult) {
	t.Helper()
	if rb.asBefore {
		if res.relayParked == 0 || res.batch3Delivered == 40 || res.retryStatus != http.StatusCreated || res.journalsWritten != 1 {
			t.Fatalf("control: the previous recovery left the system whole (relay parked %d, batch 3 %d of 40, retry %d writing %d journals); the test proves nothing",
				res.relayParked, res.batch3Delivered, res.retryStatus, res.journalsWritten)
		}
		return
	}
	wantExit := 0
	if rb.loseOneKey {
		wantExit = 1
		if res.lostKeyStatus != http.StatusConflict || res.lostKeyJournal != res.lostJournal ||
			!strings.Contains(res.recoverOut, res.lostJournal) || !strings.Contains(res.recoverOut, "STILL NOT WHOLE") {
			t.Errorf("the key of the posting that could not be rebuilt: retry %d naming %s, want 409 naming %s, and recover saying so",
				res.lostKeyStatus, res.lostKeyJournal, res.lostJournal)
		}
	}
	if res.recoverExit != wantExit {
		t.Errorf("recover exit %d, want %d", res.recoverExit, wantExit)
	}
	// A posting that could not be rebuilt stays missing from the ledger
	// (its two accounts' balances differ from what the consumers applied)
	// until an operator posts it: reconcile names it.
	wantReconcile, wantMatch := 0, runbookAccounts
	if rb.loseOneKey {
		wantReconcile, wantMatch = 1, runbookAccounts-2
	}
	if res.batch3Delivered != 40 || res.relayParked != 0 || res.consumerParked != 0 || res.reconcileExit != wantReconcile ||
		res.balancesMatch != wantMatch || res.accounts != runbookAccounts {
		t.Errorf("after the runbook: batch 3 %d of 40, parked relay %d consumers %d, reconcile exit %d, balances %d of %d (want 40, 0, 0, %d, %d of %d)",
			res.batch3Delivered, res.relayParked, res.consumerParked, res.reconcileExit, res.balancesMatch, res.accounts,
			wantReconcile, wantMatch, runbookAccounts)
	}
	switch {
	case rb.required && (res.retryStatus != http.StatusCreated || res.journalsWritten != 1):
		t.Errorf("the retry of a posting no one saw: %d, %d journals written; want 201 and the posting once", res.retryStatus, res.journalsWritten)
	case !rb.required && (res.retryStatus != http.StatusOK || res.retryJournal != res.wantJournal || res.journalsWritten != 0):
		t.Errorf("the retry of a recovered posting: %d journal %s, %d journals written; want 200, %s, none",
			res.retryStatus, res.retryJournal, res.journalsWritten, res.wantJournal)
	}
}
