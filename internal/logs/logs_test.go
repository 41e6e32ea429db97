package logs

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

func TestNew(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, slog.LevelInfo)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	log.With(slog.String("sandbox_id", "sb-1")).InfoContext(ctx, "sandbox task restarted", slog.Duration("took", 1500*time.Millisecond), slog.Duration("wait_seconds", 2*time.Second))
	log.Info("no trace", slog.Int("n", 1))
	log.Debug("not written")

	lines := bytes.Split(bytes.TrimSpace(b.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("wrote %d lines, want 2:\n%s", len(lines), b.String())
	}
	var got map[string]any
	if err := json.Unmarshal(lines[0], &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"took_seconds": 1.5, "wait_seconds": 2.0, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7", "sandbox_id": "sb-1"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("line 1: %s = %v, want %v (line %s)", k, got[k], v, lines[0])
		}
	}
	if _, ok := got["took"]; ok {
		t.Errorf("line 1 kept the nanosecond field took: %s", lines[0])
	}
	if bytes.Contains(lines[1], []byte("trace_id")) {
		t.Errorf("line 2 without a span has a trace id: %s", lines[1])
	}
}
