package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/natstest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/sinktest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A sink at a wrong address fails with an error that names the address,
// its key and the likely cause, and the watch reports it not ready; the
// same sink at the right address is ready and its publish clears the
// failure.
func TestSinkErrorsNameTheAddressAndReadinessFollows(t *testing.T) {
	t.Parallel()
	wrong := closedAddr(t)
	cases := map[string]func(addr string) configs.Sink{
		"nats": func(addr string) configs.Sink {
			s := configs.Default().Sink
			s.Kind, s.NATS.URL = "nats", "nats://"+addr
			return s
		},
		"kafka": func(addr string) configs.Sink {
			s := configs.Default().Sink
			s.Kind, s.Kafka.Brokers = "kafka", []string{addr}
			return s
		},
	}
	for kind, mk := range cases {
		t.Run(kind, func(t *testing.T) {
			sc := mk(wrong)
			raw, err := openSink(sc, nil)
			if err != nil {
				// Refused at open: the error names the key already.
				if !strings.Contains(err.Error(), "sink."+kind) {
					t.Fatalf("open: %v", err)
				}
				t.Logf("%s at a closed port, refused at open: %v", kind, err)
				return
			}
			defer raw.Close()
			// Negative control: the sink's own error does not say where.
			rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
			defer rcancel()
			if rerr := raw.Publish(rctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-a", 1)}); rerr == nil || strings.Contains(rerr.Error(), wrong) {
				t.Fatalf("the unwatched sink's error: %v", rerr)
			}
			w := newSinkWatch(sc)
			sink := w.wrap(raw)
			// Kafka's publish waits for a broker until ctx ends.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			batch := []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-a", 1)}
			err = sink.Publish(ctx, batch)
			if err == nil {
				t.Fatal("published to nothing")
			}
			t.Logf("%s at a closed port: %v", kind, err)
			for _, want := range []string{wrong, "nothing accepts connections", "sink." + kind} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if rerr := w.ready(ctx); rerr == nil || !strings.Contains(rerr.Error(), wrong) {
				t.Errorf("ready = %v, want unreachable at %s", rerr, wrong)
			}
		})
	}
	// Negative control: the watch at a server that answers is ready, and
	// a successful publish clears a remembered failure.
	url := natstest.SharedURL()
	sc := configs.Default().Sink
	sc.Kind, sc.NATS.URL, sc.NATS.SubjectPrefix = "nats", url, natstest.Prefix(t, url)
	raw, err := openSink(sc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	w := newSinkWatch(sc)
	w.set(context.DeadlineExceeded)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.ready(ctx); err == nil {
		t.Fatal("a remembered failure does not show in readiness")
	}
	if err := w.wrap(raw).Publish(ctx, []core.Envelope{sinktest.Envelope(core.TopicEvents, "acc-a", 1)}); err != nil {
		t.Fatal(err)
	}
	if err := w.ready(ctx); err != nil {
		t.Fatalf("ready after a publish to a live server: %v", err)
	}
}

// The relay's /readyz says not ready, naming the address, while its sink
// is unreachable; with a sink that is there it says ready. Either way a
// soft stop logs "relay stopped" once.
func TestRelayReadinessFollowsTheSink(t *testing.T) {
	t.Parallel()
	url, _ := pgtest.Ledger(t)
	for _, c := range []struct {
		sink []string
		code int
		want string
	}{
		{[]string{"--sink.kind", "kafka", "--sink.kafka.brokers", closedAddr(t)}, 503, "unreachable at 127.0.0.1:"},
		{[]string{"--sink.kind", "memory"}, 200, "ready"}, // negative control
	} {
		metrics := closedAddr(t)
		cmd := cliCommand([]string{"POSTHORN_DATABASE__URL=" + url}, append([]string{"relay", "--metrics.listen", metrics}, c.sink...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		startCLI(t, cmd)
		code, body := waitReadyz(t, "http://"+metrics+"/readyz", c.code, c.want)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%v: /readyz = %d %q, want %d %q", c.sink, code, body, c.code, c.want)
		}
		// A soft stop says "relay stopped" once, not once per layer.
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%v: relay exit: %v\n%s", c.sink, err, stderr.String())
		}
		if n := strings.Count(stderr.String(), `"msg":"relay stopped"`); n != 1 {
			t.Errorf("%v: \"relay stopped\" logged %d times:\n%s", c.sink, n, stderr.String())
		}
	}
}

// waitReadyz polls url until it answers want with wantBody in the body,
// or 30 s pass, and returns the last answer.
func waitReadyz(t *testing.T, url string, want int, wantBody string) (int, string) {
	t.Helper()
	code, body := 0, ""
	wait.Until(30*time.Second, func() (bool, string) {
		resp, err := http.Get(url)
		if err != nil {
			return false, ""
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code, body = resp.StatusCode, string(b)
		return code == want && strings.Contains(body, wantBody), ""
	})
	return code, body
}
