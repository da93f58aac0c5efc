package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/promtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// overTransports runs scenario once per broker, in parallel.
func overTransports(t *testing.T, scenario func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool)) {
	t.Parallel()
	for i, name := range []string{"gochannel", "kfake"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr := transports[i](t)
			scenario(t, tr, smallConsumerPool(t))
		})
	}
}

const waitLong = 60 * time.Second

func TestConsumerEveryEventAppliedOnce(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		startConsumer(t, tr, pool, rigOptions{audit: true, probe: true})
		const accounts, revisions = 5, 20
		msgs, want := postedRun("once", "acc", "EUR", accounts, revisions, func(a int, rev int64) int64 {
			delta := rev*10 - int64(a)*7
			if rev%3 == 0 {
				delta = -delta
			}
			return delta
		})
		tr.publish(t, msgs...)
		total := int64(accounts * revisions)
		wait.ForStatus(t, waitLong, "every event applied by every consumer", func() (bool, string) {
			p, a, o := counts(t, pool, projection.Name), counts(t, pool, auditlog.Name), counts(t, pool, probeConsumer)
			return p.Events[core.DispositionApplied] == total && a.Events[core.DispositionApplied] == total &&
					o.Events[core.DispositionApplied] == total,
				fmt.Sprintf("projection %v, audit %v, probe %v", p.Events, a.Events, o.Events)
		})
		for acc, sum := range want {
			if got := balance(t, pool, acc, "EUR"); got != sum {
				t.Errorf("%s balance %d, want %d", acc, got, sum)
			}
			if got := probeOrder(t, pool, acc); len(got) != revisions || got[0] != 1 || got[revisions-1] != revisions {
				t.Errorf("%s applied order %v", acc, got)
			} else {
				for i, r := range got {
					if r != int64(i+1) {
						t.Errorf("%s applied order %v, want 1..%d", acc, got, revisions)
						break
					}
				}
			}
		}
		var rows int64
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log`).Scan(&rows); err != nil || rows != total {
			t.Errorf("audit_log rows %d (%v), want %d", rows, err, total)
		}
		if c := counts(t, pool, projection.Name); c.DuplicatesAbsorbed != 0 || c.ParkedAggregates != 0 {
			t.Errorf("projection counts %+v, want no duplicates or parks", c)
		}
	})
}

func TestConsumerDuplicateDeliveryOneEffect(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		rig := startConsumer(t, tr, pool, rigOptions{})
		m := posted("dup", "acc-dup", 1, "EUR", 1250)
		tr.publish(t, m, m, m) // a resend and a replay of the same event ID
		wait.ForStatus(t, waitLong, "one applied and two duplicates", func() (bool, string) {
			c := counts(t, pool, projection.Name)
			return c.Events[core.DispositionApplied] == 1 && c.DuplicatesAbsorbed == 2, fmt.Sprintf("%+v", c)
		})
		if got := balance(t, pool, "acc-dup", "EUR"); got != 1250 {
			t.Fatalf("balance %d after 3 deliveries, want one effect: 1250", got)
		}
		recs, err := inboxstore.New(rig.pool).Dispositions(context.Background(), projection.Name, []string{m.UUID})
		if err != nil || recs[m.UUID].Disposition != core.DispositionApplied || recs[m.UUID].Duplicates != 2 {
			t.Fatalf("disposition %+v, %v", recs[m.UUID], err)
		}
		if got := promtest.Value(t, rig.prom, "posthorn_consumer_messages_total", "consumer", projection.Name, "disposition", "duplicate"); got != 2 {
			t.Fatalf("duplicate counter %v, want 2", got)
		}
		if got := promtest.Value(t, rig.prom, "posthorn_consumer_duplicate_ratio", "consumer", projection.Name); got < 0.6 || got > 0.7 {
			t.Fatalf("duplicate ratio %v, want 2/3", got)
		}
	})
}

// Negative control of the duplicate scenario: the same three deliveries
// with the inbox switched off triple the balance.
func TestConsumerDuplicateDeliveryWithoutInboxMultipliesEffect(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		startConsumer(t, tr, pool, rigOptions{noInbox: true})
		m := posted("dup", "acc-dup", 1, "EUR", 1250)
		tr.publish(t, m, m, m)
		wait.ForStatus(t, waitLong, "three effects without the inbox", func() (bool, string) {
			b := balance(t, pool, "acc-dup", "EUR")
			return b == 3*1250, fmt.Sprintf("balance %d", b)
		})
	})
}

func TestConsumerOutOfOrderHeldThenAppliedInOrder(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		rig := startConsumer(t, tr, pool, rigOptions{probe: true})
		const acc = "acc-ooo"
		tr.publish(t, posted("ooo", acc, 1, "EUR", 100))
		wait.ForStatus(t, waitLong, "revision 1 applied", func() (bool, string) {
			d := disposition(t, pool, probeConsumer, "ooo-acc-ooo-1")
			return d == core.DispositionApplied, string(d)
		})
		tr.publish(t, posted("ooo", acc, 3, "EUR", 300))
		wait.ForStatus(t, waitLong, "revision 3 held", func() (bool, string) {
			p, o := disposition(t, pool, projection.Name, "ooo-acc-ooo-3"), disposition(t, pool, probeConsumer, "ooo-acc-ooo-3")
			return p == core.DispositionHeld && o == core.DispositionHeld, fmt.Sprintf("projection %s, probe %s", p, o)
		})
		if got := balance(t, pool, acc, "EUR"); got != 100 {
			t.Fatalf("balance %d while revision 3 is held, want 100", got)
		}
		tr.publish(t, posted("ooo", acc, 2, "EUR", 200))
		wait.ForStatus(t, waitLong, "revisions 2 and 3 applied", func() (bool, string) {
			b := balance(t, pool, acc, "EUR")
			o := probeOrder(t, pool, acc)
			return b == 600 && len(o) == 3, fmt.Sprintf("balance %d, probe order %v", b, o)
		})
		if got := probeOrder(t, pool, acc); fmt.Sprint(got) != "[1 2 3]" {
			t.Fatalf("applied order %v, want [1 2 3]", got)
		}
		if got := promtest.Value(t, rig.prom, "posthorn_consumer_revision_gaps_total", "consumer", projection.Name); got != 1 {
			t.Fatalf("gap counter %v, want 1", got)
		}
		if c := counts(t, pool, projection.Name); c.ParkedAggregates != 0 || c.Events[core.DispositionApplied] != 3 {
			t.Fatalf("counts %+v", c)
		}
	})
}

func TestConsumerMissingPredecessorParkedThenReleased(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		rig := startConsumer(t, tr, pool, rigOptions{probe: true, audit: true, hold: 300 * time.Millisecond})
		ctx := context.Background()
		const acc = "acc-gap"
		tr.publish(t, posted("gap", acc, 1, "EUR", 1), posted("gap", acc, 3, "EUR", 3), posted("gap", acc, 4, "EUR", 4))
		wait.ForStatus(t, waitLong, "the account parked after the hold time", func() (bool, string) {
			var state string
			for _, c := range []string{projection.Name, probeConsumer} {
				parked, err := inboxstore.New(rig.pool).Parked(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				if len(parked) != 1 || parked[0].ID != acc || parked[0].Events != 2 {
					return false, fmt.Sprintf("%s: %+v", c, parked)
				}
				state += fmt.Sprintf("%s: %+v ", c, parked)
			}
			return true, state
		})
		parked, _ := inboxstore.New(rig.pool).Parked(ctx, projection.Name)
		t.Logf("parked: %s", parked[0].Reason)
		for _, id := range []string{"gap-acc-gap-3", "gap-acc-gap-4"} {
			if d := disposition(t, pool, projection.Name, id); d != core.DispositionParkedGap {
				t.Fatalf("%s is %s, want parked_gap", id, d)
			}
		}
		if got := balance(t, pool, acc, "EUR"); got != 1 {
			t.Fatalf("balance %d while parked, want 1: nothing applied past the gap", got)
		}
		wait.ForStatus(t, waitLong, "parked metrics", func() (bool, string) {
			g := promtest.Value(t, rig.prom, "posthorn_consumer_parked_aggregates", "consumer", projection.Name)
			c := promtest.Value(t, rig.prom, "posthorn_consumer_messages_total", "consumer", projection.Name, "disposition", "parked_gap")
			return g == 1 && c == 2, fmt.Sprintf("gauge %v, parked_gap counter %v", g, c)
		})
		// Other accounts keep flowing, and the audit log (not ordered) has
		// stored all three events.
		tr.publish(t, posted("gap", "acc-other", 1, "EUR", 7))
		wait.ForStatus(t, waitLong, "another account applied", func() (bool, string) {
			b := balance(t, pool, "acc-other", "EUR")
			a := counts(t, pool, auditlog.Name).Events[core.DispositionApplied]
			return b == 7 && a == 4, fmt.Sprintf("acc-other %d, audit applied %d", b, a)
		})

		// The replay brings the missing revision (same event ID, replay
		// header). While parked it is kept behind the park, not applied.
		replayed := posted("gap", acc, 2, "EUR", 2)
		replayed.Metadata.Set(core.HeaderReplay, "true")
		tr.publish(t, replayed)
		wait.ForStatus(t, waitLong, "the replayed event kept behind the park", func() (bool, string) {
			d := disposition(t, pool, projection.Name, replayed.UUID)
			return d == core.DispositionParkedGap, string(d)
		})
		if got := balance(t, pool, acc, "EUR"); got != 1 {
			t.Fatalf("balance %d before release, want 1", got)
		}
		for _, c := range []string{projection.Name, probeConsumer} {
			if n, err := rig.reg.Release(ctx, c, acc); err != nil || n != 3 {
				t.Fatalf("release %s: %d, %v; want 3 events", c, n, err)
			}
		}
		if got := balance(t, pool, acc, "EUR"); got != 1+2+3+4 {
			t.Fatalf("balance %d after release, want 10", got)
		}
		if got := probeOrder(t, pool, acc); fmt.Sprint(got) != "[1 2 3 4]" {
			t.Fatalf("applied order %v, want [1 2 3 4]", got)
		}
		if c := counts(t, pool, projection.Name); c.ParkedAggregates != 0 || c.Events[core.DispositionApplied] != 5 {
			t.Fatalf("counts after release %+v", c)
		}
	})
}

func TestConsumerTwoInstancesRaceOneEffect(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		startConsumer(t, tr, pool, rigOptions{instance: 0, probe: true})
		startConsumer(t, tr, pool, rigOptions{instance: 1, probe: true})
		const accounts, revisions = 3, 10
		msgs, want := postedRun("race", "race", "USD", accounts, revisions, func(_ int, rev int64) int64 { return rev })
		tr.publish(t, msgs...)
		total := int64(accounts * revisions)
		// Both instances receive every event: total applications plus
		// total absorbed repeats, whatever the interleaving.
		wait.ForStatus(t, waitLong, "every event applied once and absorbed once", func() (bool, string) {
			c := counts(t, pool, projection.Name)
			return c.Events[core.DispositionApplied] == total && c.DuplicatesAbsorbed == total, fmt.Sprintf("%+v", c)
		})
		for acc, sum := range want {
			if got := balance(t, pool, acc, "USD"); got != sum {
				t.Errorf("%s balance %d, want %d (one effect per event)", acc, got, sum)
			}
			wait.ForStatus(t, waitLong, "probe applied "+acc, func() (bool, string) {
				o := probeOrder(t, pool, acc)
				return len(o) == revisions, fmt.Sprint(o)
			})
			if got := probeOrder(t, pool, acc); fmt.Sprint(got) != "[1 2 3 4 5 6 7 8 9 10]" {
				t.Errorf("%s applied order %v", acc, got)
			}
		}
	})
}

func TestConsumerPoisonParksAndRejectsWrongKind(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		rig := startConsumer(t, tr, pool, rigOptions{audit: true})
		ctx := context.Background()
		bad := posted("poison", "acc-bad", 1, "EUR", 5)
		bad.Payload = []byte(`{"account":"acc-bad","revision":1,"currency":"EUR","delta":"not-a-number"}`)
		later := posted("poison", "acc-bad", 2, "EUR", 6)
		good := posted("poison", "acc-good", 1, "EUR", 9)
		cmd := posted("poison", "acc-cmd", 1, "EUR", 1)
		cmd.Metadata.Set(core.HeaderKind, string(core.KindCommand))
		tr.publish(t, bad, later, good, cmd)
		wait.ForStatus(t, waitLong, "poison parked, good applied, command rejected", func() (bool, string) {
			c := counts(t, pool, projection.Name)
			return c.Events[core.DispositionParkedPoison] == 1 && c.Events[core.DispositionRejected] == 1 &&
					c.Events[core.DispositionApplied] == 1 && c.Events[core.DispositionParkedGap]+c.Events[core.DispositionHeld] == 1,
				fmt.Sprintf("%+v", c)
		})
		recs, err := inboxstore.New(rig.pool).Dispositions(ctx, projection.Name, []string{bad.UUID, cmd.UUID})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("poison reason: %s; rejected reason: %s", recs[bad.UUID].Reason, recs[cmd.UUID].Reason)
		if recs[bad.UUID].Disposition != core.DispositionParkedPoison || recs[bad.UUID].Reason == "" {
			t.Fatalf("bad event %+v", recs[bad.UUID])
		}
		if got := balance(t, pool, "acc-good", "EUR"); got != 9 {
			t.Fatalf("acc-good balance %d: other accounts must keep flowing", got)
		}
		// The audit log does not depend on the predecessor: it stores the
		// bad event (valid JSON) and revision 2, and rejects the command.
		wait.ForStatus(t, waitLong, "audit log", func() (bool, string) {
			c := counts(t, pool, auditlog.Name)
			return c.Events[core.DispositionApplied] == 3 && c.Events[core.DispositionRejected] == 1, fmt.Sprintf("%+v", c)
		})
	})
}

// Negative control of the race: the same two instances with the inbox
// switched off apply every event twice.
func TestConsumerTwoInstancesWithoutInboxDoubleEffect(t *testing.T) {
	overTransports(t, func(t *testing.T, tr consumerTransport, pool *pgxpool.Pool) {
		startConsumer(t, tr, pool, rigOptions{instance: 0, noInbox: true})
		startConsumer(t, tr, pool, rigOptions{instance: 1, noInbox: true})
		var msgs []*message.Message
		for rev := int64(1); rev <= 5; rev++ {
			msgs = append(msgs, posted("race-ctl", "race-ctl", rev, "USD", rev))
		}
		tr.publish(t, msgs...)
		wait.ForStatus(t, waitLong, "every event applied by both instances", func() (bool, string) {
			b := balance(t, pool, "race-ctl", "USD")
			return b == 2*15, fmt.Sprintf("balance %d (one effect each would be 15)", b)
		})
	})
}

// A consumer stopped mid-stream (SIGTERM) and started again resumes from
// the broker's committed position; whatever is delivered again is absorbed
// by the inbox, so every event has one effect.
func TestConsumerRestartMidStreamAppliesOnce(t *testing.T) {
	t.Parallel()
	tr := kfakeTransport(t)
	pool := smallConsumerPool(t)
	first := startConsumer(t, tr, pool, rigOptions{audit: true})
	const accounts, revisions = 4, 30
	msgs, want := postedRun("restart", "restart", "EUR", accounts, revisions, func(_ int, rev int64) int64 { return rev * 3 })
	tr.publish(t, msgs...)
	total := int64(accounts * revisions)
	wait.ForStatus(t, waitLong, "some events applied before the stop", func() (bool, string) {
		n := counts(t, pool, projection.Name).Events[core.DispositionApplied]
		return n >= 10, fmt.Sprint(n)
	})
	first.stop()
	stoppedAt := counts(t, pool, projection.Name).Events[core.DispositionApplied]
	startConsumer(t, tr, pool, rigOptions{audit: true})
	wait.ForStatus(t, waitLong, "every event applied after the restart", func() (bool, string) {
		p, a := counts(t, pool, projection.Name), counts(t, pool, auditlog.Name)
		return p.Events[core.DispositionApplied] == total && a.Events[core.DispositionApplied] == total,
			fmt.Sprintf("projection %+v, audit %+v", p, a)
	})
	t.Logf("stopped after %d of %d; duplicates absorbed after restart: %d", stoppedAt, total, counts(t, pool, projection.Name).DuplicatesAbsorbed)
	for acc, sum := range want {
		if got := balance(t, pool, acc, "EUR"); got != sum {
			t.Errorf("%s balance %d, want %d", acc, got, sum)
		}
	}
}
