package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	phnats "github.com/posthorn/posthorn/adapters/nats"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/ops"
)

// From the command line against NATS JetStream: `outbox resend` and then,
// right after, `posthorn replay` of the same events both reach the stream,
// inside JetStream's 2-minute duplicate window, so a consumer sees the
// repeats. Before the fix both carried Nats-Msg-Id =
// event ID and JetStream stored each event once, whatever the operator ran.
func TestReplayAndResendReachNATSInsideTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	url := natstest.SharedURL()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Skipf("no NATS server at %s: %v", url, err)
	}
	defer nc.Close()
	prefix := natstest.Prefix(t, url)
	r := newOpsCLIRig(t)
	r.env = append(r.env, "POSTHORN_SINK__KIND=nats", "POSTHORN_SINK__NATS__URL="+url, "POSTHORN_SINK__NATS__SUBJECT_PREFIX="+prefix)
	r.post(3) // marked relayed through `outbox resend` to NATS: the first copies
	var events int64
	if err := r.ledger.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE kind = 'event'`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	stored := func() uint64 {
		info, err := js.StreamInfo(phnats.Config{SubjectPrefix: prefix}.StreamName(core.TopicEvents))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	if n := stored(); n != uint64(events) {
		t.Fatalf("after the first send the stream holds %d records, want %d", n, events)
	}
	code, stdout, stderr := runCLI(t, r.env, "replay", "--from-sequence", "1", "--json")
	var rp ops.ReplayResult
	if code != 0 || json.Unmarshal([]byte(stdout), &rp) != nil || rp.Sent != events {
		t.Fatalf("replay: code %d, %s %s", code, stdout, stderr)
	}
	if n := stored(); n != uint64(2*events) {
		t.Fatalf("after the replay the stream holds %d records, want %d: JetStream swallowed the replay", n, 2*events)
	}
	if code, stdout, stderr := runCLI(t, r.env, "outbox", "resend", "--from-id", "1", "--to-id", fmt.Sprint(events*2)); code != 0 {
		t.Fatalf("resend: code %d, %s %s", code, stdout, stderr)
	}
	if n := stored(); n < uint64(3*events) {
		t.Fatalf("after a second resend the stream holds %d records, want at least %d: JetStream swallowed the resend", n, 3*events)
	}
}
