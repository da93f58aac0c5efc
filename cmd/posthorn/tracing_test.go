package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// collectedSpan is one span a stand-in OTLP collector received.
type collectedSpan struct {
	name, traceID, spanID, parentID, command string
}

// collector is a stand-in OTLP/HTTP collector keeping every span it is sent.
type collector struct {
	mu    sync.Mutex
	spans []collectedSpan
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		var command string
		for _, a := range rs.Resource.GetAttributes() {
			if a.Key == "posthorn.command" {
				command = a.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans = append(c.spans, collectedSpan{name: s.Name, traceID: hex.EncodeToString(s.TraceId),
					spanID: hex.EncodeToString(s.SpanId), parentID: hex.EncodeToString(s.ParentSpanId), command: command})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (c *collector) named(prefix string) []collectedSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []collectedSpan
	for _, s := range c.spans {
		if strings.HasPrefix(s.name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// startLogged starts cmd (startCLI) and reads its stderr, a JSON log,
// until the line whose msg is msg, which it returns; nil, with the
// reader's error, when the log ends first. The rest of the log is drained
// in the background so the process never blocks on a full pipe.
func startLogged(t *testing.T, cmd *exec.Cmd, msg string) (map[string]any, error) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	startCLI(t, cmd)
	sc := bufio.NewScanner(stderr)
	var rec map[string]any
	for rec == nil && sc.Scan() {
		if json.Unmarshal(sc.Bytes(), &rec) != nil || rec["msg"] != msg {
			rec = nil
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return rec, sc.Err()
}

// The binary wires tracing.*: `posthorn api` continues the caller's trace
// and flushes its span to the collector when SIGTERM stops it; `posthorn
// relay` then publishes the posting's rows in spans that are the API
// span's children, flushed at its stop too.
func TestTracingFromTheBinary(t *testing.T) {
	t.Parallel()
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	url, _ := pgtest.Ledger(t)
	env := []string{"POSTHORN_TRACING__EXPORTER=otlp", "POSTHORN_TRACING__ENDPOINT=" + srv.URL, "POSTHORN_API__TOKENS=", "POSTHORN_LOG__FORMAT=json"}

	api := cliCommand(env, "api", "--database.url", url, "--api.listen", "127.0.0.1:0")
	rec, err := startLogged(t, api, "Posting API listening")
	if rec == nil {
		t.Fatalf("no listening line in the API's log (%v)", err)
	}
	postTransfer(t, rec["addr"].(string), "cli-trace-1", map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	if err := api.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := api.Wait(); err != nil {
		t.Fatalf("posthorn api after SIGTERM: %v, want exit 0", err)
	}
	apiSpans := col.named("POST /v1/postings")
	if len(apiSpans) != 1 || apiSpans[0].traceID != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		apiSpans[0].parentID != "00f067aa0ba902b7" || apiSpans[0].command != "posthorn api" {
		t.Fatalf("collector got API spans %+v, want one continuing the caller's trace from posthorn api", apiSpans)
	}

	relay := cliCommand(env, "relay", "--database.url", url, "--sink.kind", "memory")
	if rec, err := startLogged(t, relay, "relay started"); rec == nil {
		t.Fatalf("the relay did not start (%v)", err)
	}
	// The batch processor exports every 5 s; the stop flushes at once.
	// Wait for the rows to be relayed, then stop.
	pool := pgtest.Pool(t, url, 1)
	wait.For(t, 30*time.Second, "the relay to relay the posting's rows", func() bool {
		return pgtest.Column[int64](t, pool, `SELECT count(*) FROM outbox_pending`)[0] == 0
	})
	if err := relay.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := relay.Wait(); err != nil {
		t.Fatalf("posthorn relay after SIGTERM: %v, want exit 0", err)
	}
	publish := col.named("publish ")
	if len(publish) != 2 {
		t.Fatalf("collector got %d publish spans, want one per event (2): %+v", len(publish), publish)
	}
	for _, p := range publish {
		if p.traceID != apiSpans[0].traceID || p.parentID != apiSpans[0].spanID || p.command != "posthorn relay" {
			t.Errorf("publish span %+v is not the API span's child from posthorn relay", p)
		}
	}
}
