package faultkit

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/relay"
)

// FirstApplied and Rejoins read the consumers' logs as Start writes them:
// a marker line per start, then the process's JSON lines. The first start
// is no restart; a restart that applied nothing is left out.
func TestConsumerLogFigures(t *testing.T) {
	p := NewProc(ProcConfig{Name: "consumer-1", LogDir: t.TempDir()})
	log := `==== consumer-1 start 1 at 2026-12-02T06:00:00Z
{"time":"2026-12-02T06:00:01Z","level":"INFO","msg":"` + consumers.FirstAppliedLogMessage + `","consumer":"audit-log"}
==== consumer-1 start 2 at 2026-12-02T06:01:00.5Z
{"time":"2026-12-02T06:01:00.9Z","level":"INFO","msg":"consumers starting"}
{"time":"2026-12-02T06:01:01.75Z","level":"INFO","msg":"` + consumers.FirstAppliedLogMessage + `","consumer":"audit-log"}
{"time":"2026-12-02T06:01:02Z","level":"INFO","msg":"` + consumers.FirstAppliedLogMessage + `","consumer":"balance-projection"}
{"time":"2026-12-02T06:01:40Z","level":"ERROR","msg":"` + kafkagroup.RejoinLogMessage + `","consumer_group":"audit-log","error":"partitions 3"}
not json: a goroutine dump
==== consumer-1 start 3 at 2026-12-02T06:02:00Z
{"time":"2026-12-02T06:02:01Z","level":"INFO","msg":"consumers starting"}
`
	if err := os.WriteFile(p.LogPath(), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &System{Consumers: []*Proc{p}}
	if got := s.FirstApplied(); !slices.Equal(got, []time.Duration{1250 * time.Millisecond}) {
		t.Fatalf("FirstApplied = %v, want [1.25s] (the second start's earliest consumer; the first start and an idle restart left out)", got)
	}
	if got := s.Rejoins(); !slices.Equal(got, []string{"06:01:40 consumer-1 audit-log: partitions 3"}) {
		t.Fatalf("Rejoins = %q", got)
	}
}

// A relay's audit finding, as slog writes it, is found by the text the
// fault runs look for; other lines are not.
func TestMatchingFindsTheAuditInARelayLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(f, nil))
	log.Error("read outbox", "err", fmt.Errorf("read outbox batch: %w: shard 3: row 11 below mark 32", relay.ErrRowsBelowMarks))
	log.Error("read outbox", "err", errors.New("conn closed"))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got := Matching(path, relay.ErrRowsBelowMarks.Error(), 5)
	if !strings.Contains(got, "row 11 below mark 32") || strings.Contains(got, "conn closed") {
		t.Fatalf("Matching = %q", got)
	}
}
