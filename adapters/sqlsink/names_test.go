package sqlsink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/sqlsink"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// Two topics whose names share their first 60 bytes get tables (and
// offsets tables) of their own: each topic's table and subscriber hold its
// record only, and a short topic keeps watermill-sql's name. Negative
// control: with watermill-sql's default names PostgreSQL cuts both table
// names to the same 63 bytes, and one table holds both topics' records.
func TestLongTopicsGetTablesOfTheirOwn(t *testing.T) {
	t.Parallel()
	target := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	common := "commands." + strings.Repeat("w", 51)
	a, b := common+".alpha", common+".beta"
	if got := sqlsink.Schema().MessagesTable(core.TopicEvents); got != `"watermill_ledger.events"` {
		t.Errorf("ledger.events' table is %s, earlier versions used \"watermill_ledger.events\"", got)
	}
	for _, name := range []string{sqlsink.Schema().MessagesTable(a), sqlsink.OffsetsAdapter().MessagesOffsetsTable(a)} {
		if len(name) > 63+2 {
			t.Fatalf("table name %s is longer than an identifier", name)
		}
	}

	s := sinktest.Open(t, sqlsink.New, sqlsink.Config{URL: target})
	ea, eb := sinktest.Envelope(a, "acc-1", 1), sinktest.Envelope(b, "acc-1", 1)
	if err := s.Publish(ctx, []core.Envelope{ea, eb}); err != nil {
		t.Fatal(err)
	}
	for _, e := range []core.Envelope{ea, eb} {
		recs, err := readFunc(target)(ctx, e.Topic, 1)
		if err != nil || len(recs) != 1 || recs[0].Headers[core.HeaderEventID] != e.EventID {
			t.Fatalf("table of topic %.20q…: %d records (%v), want its own only", e.Topic[len(common):], len(recs), err)
		}
	}
	pool, err := pgxpool.New(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{ConsumerGroup: "c",
		SchemaAdapter: sqlsink.Schema(), OffsetsAdapter: sqlsink.OffsetsAdapter(), InitializeSchema: true,
		PollInterval: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, e := range []core.Envelope{ea, eb} {
		ch, err := sub.Subscribe(ctx, e.Topic)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ch:
			m.Ack()
			if m.UUID != e.EventID {
				t.Fatalf("subscriber of topic …%s got %s, want %s", e.Topic[len(common):], m.UUID, e.EventID)
			}
		case <-ctx.Done():
			t.Fatal("subscriber got nothing")
		}
	}

	// Negative control: watermill-sql's default names, on the real server.
	old := wmsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return "BYTEA" }}
	conn, err := pgx.Connect(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	oa, ob := "x"+a, "x"+b
	for _, topic := range []string{oa, ob} {
		qs, err := old.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if _, err := conn.Exec(ctx, q.Query, q.Args...); err != nil {
				t.Fatal(err)
			}
		}
		pub, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{SchemaAdapter: old}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+old.MessagesTable(oa)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("negative control: the old name of topic a's table holds %d records, want both topics' 2", n)
	}
}
