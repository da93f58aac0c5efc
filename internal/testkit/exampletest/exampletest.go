// Package exampletest runs the path an example publishes into, as its end
// to end test needs it: a Kafka-protocol broker (kfake, over real sockets)
// and the posthorn relay as a real process, which the test SIGKILLs and
// starts again while the example publishes.
package exampletest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// Path is a ledger database with Posthorn's schema, a broker holding
// topics, and a relay process between them.
type Path struct {
	LedgerURL, ConsumerURL string
	Brokers                []string
	Relay                  *faultkit.Proc
}

// Start migrates a fresh ledger database (the service's own tables go in
// it too: they commit with the outbox) and a fresh consumer database,
// starts a broker with topics (4 partitions each) and a relay on them.
func Start(t *testing.T, topics ...string) *Path {
	t.Helper()
	ctx := context.Background()
	p := &Path{LedgerURL: pgtest.NewDatabase(t), ConsumerURL: pgtest.NewDatabase(t)}
	if err := postgres.Migrate(ctx, p.LedgerURL, postgres.LedgerSchema); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, p.ConsumerURL, postgres.ConsumerSchema); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topics...), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	p.Brokers = cluster.ListenAddrs()
	dir := t.TempDir()
	bin, err := faultkit.Build(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	p.Relay = faultkit.NewProc(faultkit.ProcConfig{Name: "relay", Bin: bin, LogDir: dir, Args: []string{"relay"},
		Env: []string{"POSTHORN_DATABASE__URL=" + p.LedgerURL, "POSTHORN_SINK__KIND=kafka",
			"POSTHORN_SINK__KAFKA__BROKERS=" + p.Brokers[0], "POSTHORN_RELAY__POLL_INTERVAL=100ms",
			"POSTHORN_RELAY__LEASE_TTL=2s", "POSTHORN_LOG__LEVEL=warn"}})
	if err := p.Relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Relay.Close)
	return p
}

// KillRelayWhile runs publish and SIGKILLs the relay kills times while it
// runs, starting it again each time. Each kill comes once the relay
// (re)started has marked rows since its start, so it lands on a relay at
// work, where a batch can be cut between the broker's ACK and the marker;
// it returns when publish has returned.
func (p *Path) KillRelayWhile(t *testing.T, kills int, publish func()) {
	t.Helper()
	ledger := pgtest.Pool(t, p.LedgerURL, 2)
	marked := func() int64 {
		var n int64
		// Rows written minus rows pending: what the relay has marked.
		if err := ledger.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM outbox) - (SELECT count(*) FROM outbox_pending)`).Scan(&n); err != nil {
			t.Errorf("count marked rows: %v", err)
		}
		return n
	}
	done := make(chan struct{})
	go func() { defer close(done); publish() }()
	for range kills {
		// Kill the relay once it has marked something since its last start
		// (or after 20 s regardless: a kill of an idle relay proves less,
		// not nothing).
		since := marked()
		wait.Until(20*time.Second, func() (bool, string) { return marked() != since, "" })
		p.Relay.Kill()
		if err := p.Relay.Start(context.Background()); err != nil {
			t.Fatalf("restart the relay: %v\n%s", err, faultkit.Tail(p.Relay.LogPath(), 20))
		}
	}
	<-done
}
