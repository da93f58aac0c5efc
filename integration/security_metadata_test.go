package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/posthorn/posthorn/adapters/memory"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/relaytest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
	"github.com/posthorn/posthorn/relay"
)

// wireRecord is one record as a sink holds it: key (Kafka), headers, payload.
type wireRecord struct {
	sink, topic string
	key         string
	headers     map[string]string
	payload     []byte
}

// contains reports whether s appears anywhere in the record.
func (r wireRecord) contains(s string) bool {
	if strings.Contains(r.key, s) || strings.Contains(r.topic, s) || bytes.Contains(r.payload, []byte(s)) {
		return true
	}
	for k, v := range r.headers {
		if strings.Contains(k, s) || strings.Contains(v, s) {
			return true
		}
	}
	return false
}

// postThroughAPI posts n transfers with metadata md and one command each
// through the real Posting API over HTTP.
func postThroughAPI(t *testing.T, store api.Store, n int, md string) {
	t.Helper()
	srv, err := api.New(api.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, store)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	for i := range n {
		body := fmt.Sprintf(`{"entries":[{"account":"acc-a%d","direction":"debit","amount":"100","currency":"EUR"},
{"account":"acc-b%d","direction":"credit","amount":"100","currency":"EUR"}],
"metadata":%s,"commands":[{"type":"payouts.payout.execute","payload":{"beneficiary":"acc-b%d"}}]}`, i%3, i%2, md, i)
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/postings", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("md-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("post %d: %d %s", i, resp.StatusCode, b)
		}
	}
}

// relayToMemory runs the relay into a fresh memory sink until the outbox
// is drained and returns every record it holds.
func relayToMemory(t *testing.T, pool *pgxpool.Pool) []wireRecord {
	t.Helper()
	sink := memory.New(memory.Config{})
	defer sink.Close()
	rel := startRelay(t, pool, sink, relay.Settings{
		Owner: "md-relay-memory", PollInterval: 50 * time.Millisecond, LeaseTTL: 5 * time.Second, Logger: relayQuietLog,
	})
	wait.For(t, 60*time.Second, "outbox relayed to memory", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rel.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	var out []wireRecord
	for _, topic := range []string{core.TopicEvents, "commands.payouts"} {
		for _, m := range sink.Records(topic) {
			out = append(out, wireRecord{sink: "memory", topic: topic, key: m.UUID, headers: m.Metadata, payload: m.Payload})
		}
	}
	return out
}

// relayToKafka runs the relay into a kfake broker over real sockets and
// reads every topic back from the start with franz-go.
func relayToKafka(t *testing.T, pool *pgxpool.Pool, want int) []wireRecord {
	t.Helper()
	b := startRelayBroker(t)
	rel, _ := startKafkaRelay(t, pool, b.addrs, "md-relay-kafka")
	wait.For(t, 60*time.Second, "outbox relayed to kafka", func() bool { return relaytest.Unrelayed(t, pool) == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rel.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.ConsumeRegex(), kgo.ConsumeTopics(".*"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	var out []wireRecord
	for len(out) < want && rctx.Err() == nil {
		cl.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
			out = append(out, wireRecord{sink: "kafka", topic: r.Topic, key: string(r.Key), headers: headers(r), payload: r.Value})
		})
	}
	return out
}

// TestSecurityMetadataAllowlistOnEverySink: postings with an allow-listed
// key and a private one go through the Posting API, the relay sends them to
// the memory sink and to Kafka (kfake over sockets), and every record read
// back carries the allowed key (events only, as meta_<key>) and nothing of
// the private one — neither its name nor its value, in no header, key or
// payload, and not in the outbox row the relay reads. Control: with the
// private key allow-listed too, the same scan finds it on both sinks, so the
// scan looks where a leak would be.
func TestSecurityMetadataAllowlistOnEverySink(t *testing.T) {
	t.Parallel()
	const postings = 4
	for _, tc := range []struct {
		name     string
		allow    []string
		wantLeak bool
	}{
		{"allow-list", []string{"reference"}, false},
		{"control: private key allow-listed", []string{"reference", "private_note"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rb [8]byte
			_, _ = rand.Read(rb[:])
			marker := "PRIVATE-" + hex.EncodeToString(rb[:])
			_, pool := pgtest.Ledger(t)
			store := ledgerstore.New(pool, ledgerstore.Config{MetadataAllowlist: tc.allow})
			postThroughAPI(t, store, postings, fmt.Sprintf(`{"reference":"inv-42","private_note":%q}`, marker))

			var outboxHits int
			if err := pool.QueryRow(context.Background(),
				`SELECT count(*) FROM outbox WHERE headers::text LIKE '%'||$1||'%' OR payload::text LIKE '%'||$1||'%' OR headers ? 'meta_private_note'`,
				marker).Scan(&outboxHits); err != nil {
				t.Fatal(err)
			}
			records := relayToMemory(t, pool)
			if _, err := pool.Exec(context.Background(), `INSERT INTO outbox_pending (shard, id) SELECT shard, id FROM outbox ON CONFLICT DO NOTHING`); err != nil {
				t.Fatal(err)
			}
			records = append(records, relayToKafka(t, pool, len(records)*2)...)

			perSink := map[string]int{}
			leaks := map[string]int{}
			for _, r := range records {
				perSink[r.sink]++
				if r.contains(marker) || r.contains("private_note") {
					leaks[r.sink]++
				}
				kind := r.headers[core.HeaderKind]
				switch kind {
				case string(core.KindEvent):
					if r.headers["meta_reference"] != "inv-42" {
						t.Errorf("%s %s: event without meta_reference: %v", r.sink, r.headers[core.HeaderEventID], r.headers)
					}
				case string(core.KindCommand):
					for k := range r.headers {
						if strings.HasPrefix(k, ledgerstore.MetadataHeaderPrefix) {
							t.Errorf("%s: a command carries metadata header %s", r.sink, k)
						}
					}
				default:
					t.Errorf("%s: record without kind header: %v", r.sink, r.headers)
				}
			}
			// 2 events + 1 command per posting, on each sink.
			if perSink["memory"] != 3*postings || perSink["kafka"] != 3*postings {
				t.Fatalf("records per sink %v, want %d each", perSink, 3*postings)
			}
			if tc.wantLeak {
				if leaks["memory"] != 2*postings || leaks["kafka"] != 2*postings || outboxHits == 0 {
					t.Fatalf("control: the scan found the allow-listed private key in %v records and %d outbox rows; want every event on both sinks", leaks, outboxHits)
				}
				return
			}
			if len(leaks) != 0 || outboxHits != 0 {
				t.Fatalf("a key not on the allow-list reached the wire: %v records, %d outbox rows", leaks, outboxHits)
			}
			// The ledger itself keeps the whole metadata.
			var kept int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM journals WHERE metadata->>'private_note' = $1`, marker).Scan(&kept); err != nil || kept != postings {
				t.Fatalf("journals keep the metadata: %d, %v", kept, err)
			}
		})
	}
}

// Allow-listed metadata above outbox.metadata_max_bytes is refused with a
// 422 naming "metadata", and nothing is written; the same posting under the
// limit is accepted (control).
func TestSecurityMetadataSizeLimit(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Ledger(t)
	before := pgtest.LedgerState(t, pool)
	store := ledgerstore.New(pool, ledgerstore.Config{MetadataAllowlist: []string{"reference"}, MetadataMaxBytes: 32})
	srv, err := api.New(api.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, store)
	if err != nil {
		t.Fatal(err)
	}
	post := func(ref string) (int, string) {
		body := fmt.Sprintf(`{"entries":[{"account":"acc-a","direction":"debit","amount":"1","currency":"EUR"},
{"account":"acc-b","direction":"credit","amount":"1","currency":"EUR"}],"metadata":{"reference":%q,"other":"%s"}}`, ref, strings.Repeat("x", 400))
		req := httptest.NewRequest(http.MethodPost, "/v1/postings", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "size-"+ref)
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	code, body := post(strings.Repeat("r", 40))
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, `"field":"metadata"`) {
		t.Fatalf("over the limit: %d %s", code, body)
	}
	if after := pgtest.LedgerState(t, pool); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a refused posting left a trace: %v → %v", before, after)
	}
	// Not allow-listed metadata does not count; an allowed value within the limit passes.
	if code, body := post("inv-1"); code != http.StatusCreated {
		t.Fatalf("control under the limit: %d %s", code, body)
	}
}
