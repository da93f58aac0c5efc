package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/childtest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// consume reads what a relay published to Kafka (kfake over a socket),
// applies it in both example consumers, reports it in `consume status`,
// and exits 0 on SIGTERM.
func TestConsumeAgainstKafkaStopsCleanly(t *testing.T) {
	t.Parallel()
	dsn, env := kafkaConsumeEnv(t, "POSTHORN_METRICS__LISTEN=127.0.0.1:0")
	if code, _, stderr := runCLI(t, env, "consume"); code == 0 || !strings.Contains(stderr, "migrate --consumer") {
		t.Fatalf("consume before migrate: code %d, stderr %q; want a hint to migrate", code, stderr)
	}
	if code, _, stderr := runCLI(t, env, "migrate", "--consumer"); code != 0 {
		t.Fatalf("migrate --consumer: %d %s", code, stderr)
	}

	cmd := cliCommand(env, "consume")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	consume := childtest.Start(t, cmd)

	pool := pgtest.Pool(t, dsn, 2)
	waitApplied(t, pool, consume, &stderr, -15)
	consume.Term(t, 45*time.Second, &stderr)

	code, stdout, errOut := runCLI(t, env, "consume", "status", "--json")
	if code != 0 {
		t.Fatalf("consume status: %d %s", code, errOut)
	}
	var st []consumerStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil || len(st) != 2 {
		t.Fatalf("status %q: %v", stdout, err)
	}
	for _, s := range st {
		if s.Events["applied"] != 3 || len(s.Parked) != 0 {
			t.Fatalf("status %+v", s)
		}
	}
	code, stdout, _ = runCLI(t, env, "consume", "release", "--consumer", "balance-projection", "--account", "acc-cli")
	if code != 0 || !strings.Contains(stdout, "nothing parked") {
		t.Fatalf("release: %d %q", code, stdout)
	}
	if code, _, errOut := runCLI(t, env, "consume", "--only", "nope"); code != 1 || !strings.Contains(errOut, "want one of") {
		t.Fatalf("--only nope: %d %q", code, errOut)
	}
}

// kafkaConsumeEnv gives `posthorn consume` a fresh consumer database (not
// migrated) and kafkaWithEvents' broker, plus the extra variables.
func kafkaConsumeEnv(t *testing.T, extra ...string) (dsn string, env []string) {
	t.Helper()
	brokers := kafkaWithEvents(t)
	dsn = pgtest.NewDatabase(t)
	return dsn, append([]string{"POSTHORN_CONSUMER__DATABASE__URL=" + dsn, "POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=" + brokers}, extra...)
}

// kafkaWithEvents starts a kfake broker holding three events of acc-cli
// (-5 EUR each) on core.TopicEvents and returns its address list.
func kafkaWithEvents(t *testing.T) string {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, core.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: cluster.ListenAddrs(),
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get(core.HeaderAggregateID), nil
		}),
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for rev := int64(1); rev <= 3; rev++ {
		p, _ := json.Marshal(core.AccountPosted{EventID: fmt.Sprint("cli-", rev), Account: "acc-cli", Revision: rev, Currency: "EUR", Delta: "-5"})
		e := core.Envelope{EventID: fmt.Sprint("cli-", rev), Kind: core.KindEvent, Type: core.TypeAccountPosted,
			AggregateType: core.AggregateAccount, AggregateID: "acc-cli", Revision: rev, OccurredAt: time.Now(), Payload: p}
		if err := pub.Publish(core.TopicEvents, e.ToMessage()); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(cluster.ListenAddrs(), ",")
}

// waitApplied waits until the three events of kafkaWithEvents are in the
// audit log and acc-cli's projected balance is balance (0: projection not
// running), failing if consume exits first.
func waitApplied(t *testing.T, pool *pgxpool.Pool, consume *childtest.Child, stderr fmt.Stringer, balance int64) {
	t.Helper()
	var bal, audited int64
	applied := wait.Until(60*time.Second, func() (bool, string) {
		_ = pool.QueryRow(context.Background(), `SELECT coalesce((SELECT balance::bigint FROM projection_balances WHERE account = 'acc-cli'), 0),
			(SELECT count(*) FROM audit_log)`).Scan(&bal, &audited)
		select {
		case <-consume.Exited():
			t.Fatalf("consume exited early: %v\n%s", consume.Err(), stderr)
		default:
		}
		return bal == balance && audited == 3, ""
	})
	if !applied {
		// stderr is read only now: the child may still be writing it.
		t.Fatalf("balance %d, audited %d after 60s, want %d and 3; stderr:\n%s", bal, audited, balance, stderr)
	}
}

// Two processes given the same consumer.instance_id: the second's join
// fences the first, which exits 1 naming the key instead of taking the ID
// back; the second runs on.
func TestConsumeDuplicateInstanceIDExits(t *testing.T) {
	t.Parallel()
	dsn, env := kafkaConsumeEnv(t, "POSTHORN_CONSUMER__INSTANCE_ID=node-1")
	if code, _, stderr := runCLI(t, env, "migrate", "--consumer"); code != 0 {
		t.Fatalf("migrate --consumer: %d %s", code, stderr)
	}
	start := func() (*childtest.Child, *bytes.Buffer) {
		cmd := cliCommand(env, "consume", "--only", "audit-log")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		return childtest.Start(t, cmd), &stderr
	}
	first, firstErr := start()
	waitApplied(t, pgtest.Pool(t, dsn, 2), first, firstErr, 0)
	second, secondErr := start()
	select {
	case <-first.Exited():
	case <-time.After(time.Minute): // liveness: its next heartbeat (2 s) is fenced
		t.Fatalf("the first process still runs beside a second with its instance ID\n%s", firstErr)
	}
	if first.Err() == nil || !strings.Contains(firstErr.String(), "config key consumer.instance_id") || !strings.Contains(firstErr.String(), "node-1.") {
		t.Fatalf("fenced process: %v, want exit 1 naming consumer.instance_id and the instance ID\n%s", first.Err(), firstErr)
	}
	second.Term(t, 45*time.Second, secondErr)
}
