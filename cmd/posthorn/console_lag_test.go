package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/console"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// listenAddrHandler is a log handler that hands over the addr attribute of
// the record with message msg (the consumers' metrics address).
type listenAddrHandler struct {
	msg  string
	addr chan string
}

func (h listenAddrHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h listenAddrHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h listenAddrHandler) WithGroup(string) slog.Handler            { return h }
func (h listenAddrHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "addr" {
				h.addr <- a.Value.String()
				return false
			}
			return true
		})
	}
	return nil
}

var offsetLagLine = regexp.MustCompile(`^posthorn_consumer_offset_lag\{consumer="([^"]+)",partition="(\d+)",topic="([^"]+)"\} (\S+)$`)

// offsetLag scrapes addr's posthorn_consumer_offset_lag and returns, per
// consumer, the sum over its partitions and how many partitions report.
func offsetLag(t *testing.T, addr string) (lag map[string]float64, partitions map[string]int) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lag, partitions = map[string]float64{}, map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := offsetLagLine.FindStringSubmatch(sc.Text()); m != nil {
			v, err := strconv.ParseFloat(m[4], 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			lag[m[1]] += v
			partitions[m[1]]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lag, partitions
}

// The console's lag is the metric's: postings flow through a relay into
// Kafka (kfake) and both example consumers while requests are refused with
// 409 (a key reused for another posting) and repeated (idempotent replays),
// and once every event is applied the console's lag of each consumer and
// posthorn_consumer_offset_lag both read 0, in the same run. The control
// is the console's former definition (largest outbox id minus backlog
// minus the events recorded), which the refused and repeated requests keep
// above 0 for good.
func TestConsoleLagIsTheMetricsLag(t *testing.T) {
	t.Parallel()
	r := newConsoleRig(t, "", memory.Config{})
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, core.TopicEvents))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	cfg, err := configs.Load("", append(append([]string{}, r.env...), "POSTHORN_SINK__KIND=kafka",
		"POSTHORN_SINK__KAFKA__BROKERS="+strings.Join(cluster.ListenAddrs(), ","), "POSTHORN_METRICS__LISTEN=127.0.0.1:0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()

	sink, err := openSink(cfg.Sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	defer startRigRelay(t, ctx, r.ledger, sink, "console-lag-test", "kafka", 50*time.Millisecond)()
	metricsAddr := make(chan string, 1)
	wg.Go(func() {
		log := slog.New(listenAddrHandler{msg: "consumer metrics listening", addr: metricsAddr})
		if err := runConsumers(ctx, cfg, consumeOptions{log: log}); err != nil {
			t.Errorf("consumers: %v", err)
		}
	})

	// Postings, each followed by a replay of its request and a refused
	// request under its key; the store is the Posting API's.
	const postings = 12
	var events int64
	for i := range postings {
		key := fmt.Sprintf("lag-%d", i)
		p := core.Posting{Entries: []core.Entry{
			{Account: fmt.Sprintf("acc-%d", i%3), Direction: core.Debit, Amount: 10, Currency: "EUR"},
			{Account: fmt.Sprintf("acc-%d", (i+1)%3), Direction: core.Credit, Amount: 10, Currency: "EUR"},
		}}
		res, _, err := r.store.Post(ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		events += int64(len(res.Events))
		again, _, err := r.store.Post(ctx, key, p)
		if err != nil || again.JournalID != res.JournalID {
			t.Fatalf("replay of %s: %v, journal %s want %s", key, err, again.JournalID, res.JournalID)
		}
		p.Entries[0].Amount, p.Entries[1].Amount = 11, 11
		if _, _, err := r.store.Post(ctx, key, p); !errors.Is(err, core.ErrIdempotencyConflict) {
			t.Fatalf("another posting under %s: %v, want %v (409)", key, err, core.ErrIdempotencyConflict)
		}
	}

	var addr string
	select {
	case addr = <-metricsAddr:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumers did not start their metrics listener")
	}
	names := exampleNames()
	type reading struct {
		console, metric map[string]float64
		recorded        map[string]int64
	}
	read := func() (reading, bool) {
		var s console.Series
		code, body := r.get("/samples")
		if code != http.StatusOK {
			t.Fatalf("/samples: %d %s", code, body)
		}
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatal(err)
		}
		rd := reading{console: map[string]float64{}, recorded: map[string]int64{}}
		lag, parts := offsetLag(t, addr)
		rd.metric = lag
		done := r.count(false, `SELECT count(*) FROM outbox_pending`) == 0
		for i, n := range s.Consumers {
			if len(s.Lag[i]) == 0 {
				return rd, false
			}
			rd.console[n] = s.Lag[i][len(s.Lag[i])-1]
		}
		for _, n := range names {
			c, err := inboxstore.New(r.consumer).Count(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range c.Events {
				rd.recorded[n] += k
			}
			// Applied everywhere: each consumer recorded every event and
			// has read from both partitions.
			done = done && rd.recorded[n] == events && parts[n] == 2
		}
		return rd, done
	}
	// Every event is applied; the console's next sample is taken after it.
	var rd reading
	wait.ForStatus(t, 60*time.Second, fmt.Sprintf("every event applied (%d events each)", events), func() (bool, string) {
		var done bool
		rd, done = read()
		return done, fmt.Sprintf("%+v", rd)
	})
	settled := time.Now()
	wait.For(t, 30*time.Second, "the console to take a sample after the events were applied", func() bool {
		var s console.Series
		_, body := r.get("/samples")
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatal(err)
		}
		n := len(s.Time)
		return n > 0 && time.UnixMilli(int64(s.Time[n-1]*1000)).After(settled)
	})
	rd, _ = read()

	var maxID int64
	if err := r.ledger.QueryRow(ctx, `SELECT max(id) FROM outbox`).Scan(&maxID); err != nil {
		t.Fatal(err)
	}
	st, err := relaystore.New(r.ledger).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		old := maxID - st.Backlog - rd.recorded[n]
		t.Logf("%s: console lag %v, posthorn_consumer_offset_lag %v; former console definition %d (largest outbox id %d, %d events)",
			n, rd.console[n], rd.metric[n], old, maxID, events)
		if rd.console[n] != 0 || rd.metric[n] != 0 {
			t.Errorf("%s: console lag %v, metric %v; want both 0 once every event is applied", n, rd.console[n], rd.metric[n])
		}
		if old <= 0 {
			t.Errorf("%s: control: the former definition reads %d; the refused and repeated requests should have used up ids without rows", n, old)
		}
	}
}
