package relaymetrics

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
)

// The horizon gauges: a session's age is its own; a slot's is counted from
// when the relay first saw it hold this xmin, and starts again when the
// holder or its xmin changes; a warning names the holder once past
// HorizonWarnAge, then at most once a minute; nothing held clears them.
func TestHorizonGauges(t *testing.T) {
	var logs bytes.Buffer
	m, err := New(prometheus.NewRegistry(), "memory", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	m.setHorizon(&core.LedgerHorizon{Kind: "session", Holder: "report (pid 7)", XIDAge: 40, Xmin: 100, AgeSeconds: 12}, t0)
	if got := testutil.ToFloat64(m.HorizonAge); got != 12 {
		t.Fatalf("session age %v, want its own 12 s", got)
	}
	slot := &core.LedgerHorizon{Kind: "slot", Holder: "standby_b", XIDAge: 900, Xmin: 200, AgeSeconds: -1}
	m.setHorizon(slot, t0.Add(time.Second))
	m.setHorizon(slot, t0.Add(7*time.Minute))
	if got := testutil.ToFloat64(m.HorizonAge); got != (7*time.Minute - time.Second).Seconds() {
		t.Fatalf("slot age %v, want the time since it was first seen", got)
	}
	if got := testutil.ToFloat64(m.HorizonHolder.WithLabelValues("slot", "standby_b")); got != 1 {
		t.Fatalf("holder gauge %v", got)
	}
	m.setHorizon(slot, t0.Add(7*time.Minute+10*time.Second))
	if n := strings.Count(logs.String(), "MVCC horizon is held"); n != 1 || !strings.Contains(logs.String(), "holder=standby_b") {
		t.Fatalf("warnings %d, want one naming the slot:\n%s", n, logs.String())
	}
	moved := *slot
	moved.Xmin = 300
	m.setHorizon(&moved, t0.Add(8*time.Minute))
	if got := testutil.ToFloat64(m.HorizonAge); got != 0 {
		t.Fatalf("age %v after the slot's xmin moved, want 0 (a new hold)", got)
	}
	m.setHorizon(nil, t0.Add(9*time.Minute))
	if testutil.ToFloat64(m.HorizonAge) != 0 || testutil.ToFloat64(m.HorizonXIDAge) != 0 || testutil.CollectAndCount(m.HorizonHolder) != 0 {
		t.Fatal("nothing held, but the gauges still say something is")
	}
}

// A read's error is counted as rows below the marks only when it wraps
// relay.ErrRowsBelowMarks, as the relay store's does.
func TestReadFailedCountsRowsBelowMarks(t *testing.T) {
	m, err := New(prometheus.NewRegistry(), "memory", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	m.ReadFailed(errors.New("read outbox batch: conn closed"))
	m.ReadFailed(fmt.Errorf("read outbox batch: %w: shard 3: row 11 below mark 32", relay.ErrRowsBelowMarks))
	if got := testutil.ToFloat64(m.RowsBelowMarks); got != 1 {
		t.Fatalf("posthorn_relay_rows_below_marks_total = %v, want 1", got)
	}
}
