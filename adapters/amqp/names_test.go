package amqp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	phamqp "github.com/posthorn/posthorn/adapters/amqp"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/amqptest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
)

// The queue of consumer c on topic wallet_x and the queue of consumer x_c
// on topic wallet are two queues, each holding its own topic's record;
// ordinary names stay what they were. Negative control: under the old
// naming (exchange + "_" + consumer) both are one queue, bound to both
// exchanges, and x_c receives wallet_x's record.
func TestQueuesAreOneToOneWithTopicAndConsumer(t *testing.T) {
	t.Parallel()
	tp := phamqp.Topology{ExchangePrefix: "p."}
	if got := tp.Queue(core.TopicEvents, "balance-projection"); got != "p.ledger.events_balance-projection" {
		t.Errorf("ledger.events' queue is %s, earlier versions used p.ledger.events_balance-projection", got)
	}
	if got := tp.Exchange("wallet_x"); got != "p.wallet_x" {
		t.Errorf("wallet_x's exchange is %s, earlier versions used p.wallet_x", got)
	}
	long := strings.Repeat("l", 300)
	seen := map[string]bool{}
	for _, n := range []string{tp.Queue("wallet_x", "c"), tp.Queue("wallet", "x_c"), tp.Queue(long, "c"), tp.Queue(long+"2", "c"),
		tp.Exchange(long), tp.Exchange(long + "2"), tp.Exchange("wallet~x")} {
		if seen[n] || len(n) > 255 {
			t.Fatalf("name %.80q is taken twice or too long", n)
		}
		seen[n] = true
	}

	url := amqptest.SharedURL()
	topicsHere := []string{"wallet_x", "wallet"}
	prefix := amqptest.Prefix(t, url, topicsHere, []string{"c", "x_c"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := sinktest.Open(t, phamqp.New, phamqp.Config{URL: url, ExchangePrefix: prefix, Consumers: []string{"c", "x_c"}})
	if err := s.Publish(ctx, []core.Envelope{sinktest.Envelope("wallet_x", "acc-1", 1), sinktest.Envelope("wallet", "acc-1", 1)}); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	depth := func(q string) int {
		t.Helper()
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return info.Messages
	}
	names := phamqp.Topology{ExchangePrefix: prefix}
	// Each (topic, consumer) queue holds its topic's one record.
	for _, tc := range [][2]string{{"wallet_x", "c"}, {"wallet", "x_c"}, {"wallet_x", "x_c"}, {"wallet", "c"}} {
		if n := depth(names.Queue(tc[0], tc[1])); n != 1 {
			t.Fatalf("queue of %s on %s holds %d records, want 1", tc[1], tc[0], n)
		}
	}

	// Negative control: the old names, declared and bound as the old sink did.
	old := func(topic, consumer string) string { return prefix + "old." + topic + "_" + consumer }
	if old("wallet_x", "c") != old("wallet", "x_c") {
		t.Fatal("negative control: the old names do not collide")
	}
	q := old("wallet", "x_c")
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, topic := range topicsHere {
		if err := ch.QueueBind(q, "", names.Exchange(topic), false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Publish(ctx, []core.Envelope{sinktest.Envelope("wallet_x", "acc-2", 1)}); err != nil {
		t.Fatal(err)
	}
	if n := depth(q); n != 1 {
		t.Fatalf("negative control: the shared old queue holds %d records of wallet_x, want 1 (x_c reads wallet_x's record)", n)
	}
}
