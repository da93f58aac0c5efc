package consumers

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// RouterLogger is Watermill's slog adapter for the router and subscribers
// of consumers, which drops a Trace or Debug line before it builds the
// line's attributes when log does not take that level: Watermill's router
// logs two Trace lines per message, and its adapter turns their fields into
// attributes whatever the level. A nil log is slog.Default(), as for
// watermill.NewSlogLogger.
func RouterLogger(log *slog.Logger) watermill.LoggerAdapter {
	if log == nil {
		log = slog.Default()
	}
	return levelGate{next: watermill.NewSlogLogger(log), log: log}
}

type levelGate struct {
	next watermill.LoggerAdapter
	log  *slog.Logger
}

func (g levelGate) Error(msg string, err error, fields watermill.LogFields) {
	g.next.Error(msg, err, fields)
}
func (g levelGate) Info(msg string, fields watermill.LogFields) { g.next.Info(msg, fields) }

func (g levelGate) Debug(msg string, fields watermill.LogFields) {
	if g.log.Enabled(context.Background(), slog.LevelDebug) {
		g.next.Debug(msg, fields)
	}
}

func (g levelGate) Trace(msg string, fields watermill.LogFields) {
	if g.log.Enabled(context.Background(), watermill.LevelTrace) {
		g.next.Trace(msg, fields)
	}
}

func (g levelGate) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return levelGate{next: g.next.With(fields), log: g.log}
}
