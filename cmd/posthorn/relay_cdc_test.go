package main

import (
	"bytes"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// relay.mode cdc on a server with wal_level=replica (the shared one) stops
// at start with an error naming the key and the setting to change.
func TestRelayCDCRefusesWithoutLogicalWAL(t *testing.T) {
	t.Parallel()
	url, _ := pgtest.Ledger(t)
	code, _, stderr := runCLI(t, []string{"POSTHORN_RELAY__MODE=cdc", "POSTHORN_SINK__KIND=memory"}, "relay", "--database.url", url)
	if code == 0 || !strings.Contains(stderr, "relay.mode") || !strings.Contains(stderr, "wal_level") {
		t.Fatalf("exit %d, stderr %q; want non-zero naming relay.mode and wal_level", code, stderr)
	}
}

// `posthorn relay` in CDC mode on a logical cluster relays what is posted,
// `outbox status` shows the slot's WAL pressure, and SIGTERM stops it with
// exit 0.
func TestRelayCDCRunsAndStatusShowsTheSlot(t *testing.T) {
	t.Parallel()
	_, url, pool := pgtest.LogicalLedger(t, pgcluster.Options{MaxSlotWALKeepSize: "256MB"}, 2)

	cmd := cliCommand([]string{"POSTHORN_RELAY__MODE=cdc", "POSTHORN_SINK__KIND=memory", "POSTHORN_DATABASE__URL=" + url}, "relay")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	startCLI(t, cmd)
	relaytest.MustPost(t, pool, "acc-a", "acc-b")
	wait.For(t, 30*time.Second, "the CDC relay to relay the posting", func() bool {
		return relaytest.Unrelayed(t, pool) == 0
	})

	code, stdout, serr := runCLI(t, []string{"POSTHORN_DATABASE__URL=" + url}, "outbox", "status")
	if code != 0 {
		t.Fatalf("outbox status: exit %d: %s", code, serr)
	}
	for _, want := range []string{"CDC slot posthorn_outbox", "wal_status reserved", "retained WAL", "max_slot_wal_keep_size = 256MB"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("outbox status lacks %q:\n%s", want, stdout)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("relay after SIGTERM: %v, want exit 0\n%s", err, stderr.String())
	}
	// The throwaway cluster's DSN is its superuser: the relay says so.
	if !strings.Contains(stderr.String(), `"superuser":true`) {
		t.Errorf("the CDC relay did not warn about its superuser role:\n%s", stderr.String())
	}
}
