package consumers_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/posthorn/posthorn/consumers"
)

// The router's logger writes what the slog logger's level takes, with the
// fields, and Trace and Debug lines only when that level takes them, also
// through With.
func TestRouterLoggerKeepsTheLevel(t *testing.T) {
	for _, c := range []struct {
		level slog.Level
		want  []string
	}{
		{slog.LevelInfo, []string{"info line", "error line"}},
		{slog.LevelDebug, []string{"info line", "error line", "debug line"}},
		{watermill.LevelTrace, []string{"info line", "error line", "debug line", "trace line"}},
	} {
		var buf bytes.Buffer
		l := consumers.RouterLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: c.level}))).
			With(watermill.LogFields{"handler": "h"})
		f := watermill.LogFields{"message_uuid": "m-1"}
		l.Trace("trace line", f)
		l.Debug("debug line", f)
		l.Info("info line", f)
		l.Error("error line", errors.New("boom"), f)
		out := buf.String()
		for _, want := range []string{"trace line", "debug line", "info line", "error line"} {
			wanted := false
			for _, w := range c.want {
				wanted = wanted || w == want
			}
			if strings.Contains(out, want) != wanted {
				t.Errorf("level %v: %q logged %v, want %v:\n%s", c.level, want, !wanted, wanted, out)
			}
		}
		if strings.Count(out, "handler=h") != len(c.want) || strings.Count(out, "message_uuid=m-1") != len(c.want) {
			t.Errorf("level %v: fields missing:\n%s", c.level, out)
		}
	}
}
