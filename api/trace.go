package api

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/posthorn/posthorn/core"
)

// tracerName is the instrumentation scope of the API's spans.
const tracerName = "github.com/posthorn/posthorn/api"

// traced runs next in a server span named after method and route, the
// child of the request's traceparent when it has a valid one (W3C Trace
// Context, the format the outbox rows keep), a new trace otherwise. The
// span covers authentication too, so refused requests show in the trace;
// no header value is put on it. With tracing off, next itself.
func (s *Server) traced(route string, next http.HandlerFunc) http.HandlerFunc {
	if s.tracer == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := s.tracer.Start(ctx, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	}
}

// postedSpan puts the posting's identity on the request's span, if it
// records one.
func postedSpan(ctx context.Context, res core.PostingResult, replayed bool) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String("posthorn.journal_id", res.JournalID),
		attribute.Int("posthorn.events", len(res.Events)),
		attribute.Int("posthorn.commands", len(res.Commands)),
		attribute.Bool("posthorn.idempotent_replay", replayed))
}

// statusWriter keeps the status code a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
