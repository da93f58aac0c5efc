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
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/adapters/postgres/pgtest"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/childtest"
)

// consume reads what a relay published to Kafka (kfake over a socket),
// applies it in both example consumers, reports it in `consume status`,
// and exits 0 on SIGTERM.
func TestConsumeAgainstKafkaStopsCleanly(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, core.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := strings.Join(cluster.ListenAddrs(), ",")
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

	dsn := pgtest.NewDatabase(t)
	env := []string{"POSTHORN_CONSUMER__DATABASE__URL=" + dsn, "POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=" + brokers,
		"POSTHORN_METRICS__LISTEN=127.0.0.1:0"}
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
	deadline := time.Now().Add(60 * time.Second)
	for {
		var bal, audited int64
		_ = pool.QueryRow(context.Background(), `SELECT coalesce((SELECT balance::bigint FROM projection_balances WHERE account = 'acc-cli'), 0),
			(SELECT count(*) FROM audit_log)`).Scan(&bal, &audited)
		if bal == -15 && audited == 3 {
			break
		}
		select {
		case <-consume.Exited():
			t.Fatalf("consume exited early: %v\n%s", consume.Err(), stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("balance %d, audited %d; stderr:\n%s", bal, audited, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
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
