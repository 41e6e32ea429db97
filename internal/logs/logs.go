// Package logs builds the JSON loggers of berthd and berth-agent: one line
// per record on a writer, durations in seconds, and the OpenTelemetry trace
// and span ids of the record's context, so that a log line can be found
// from a trace and the other way round.
package logs

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// New returns a logger writing JSON lines to w at level and above.
//
// A time.Duration attribute is written as a number of seconds under its key
// with "_seconds" appended ("took": 1.5s becomes "took_seconds": 1.5; slog's
// default is integer nanoseconds). A record logged with a context that
// carries a valid span gets "trace_id" and "span_id" (hex, as W3C
// traceparent writes them).
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: seconds})
	return slog.New(traceHandler{h})
}

// seconds rewrites duration attributes as seconds.
func seconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	key := a.Key
	if !strings.HasSuffix(key, "_seconds") {
		key += "_seconds"
	}
	return slog.Float64(key, a.Value.Duration().Seconds())
}

// traceHandler adds the trace and span ids of the record's context.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
