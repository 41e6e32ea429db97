package server

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
)

// TestRefusalSampler: one line per key per interval, the next one written
// saying how many were left out; keys are limited apart.
func TestRefusalSampler(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newRefusalSampler(time.Second)
	s.now = func() time.Time { return now }
	if ok, n := s.allow("Run"); !ok || n != 0 {
		t.Fatalf("first Run refusal: allow = %v, %d; want written, 0 left out", ok, n)
	}
	for i := range 500 {
		if ok, _ := s.allow("Run"); ok {
			t.Fatalf("Run refusal %d within the second written, want left out", i+2)
		}
	}
	if ok, _ := s.allow("CreateSandbox"); !ok {
		t.Error("first CreateSandbox refusal left out by Run's; want each key limited apart")
	}
	now = now.Add(time.Second)
	if ok, n := s.allow("Run"); !ok || n != 500 {
		t.Errorf("Run refusal a second later: allow = %v, %d; want written with 500 left out", ok, n)
	}
	if ok, n := s.allow("Run"); ok || n != 0 {
		t.Errorf("next Run refusal: allow = %v, %d; want left out", ok, n)
	}
}

// TestRPCLoggerRateLimitsRefusals: 1,000 refused Runs within a second
// write one log line; other codes are all written (issue 23: every refusal
// wrote a line).
func TestRPCLoggerRateLimitsRefusals(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	s := newRefusalSampler(time.Second)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	lf := rpcLogger(log, s)
	for range 1000 {
		lf(context.Background(), logging.LevelInfo, "finished call", logging.MethodFieldKey, "Run", "grpc.code", "ResourceExhausted")
	}
	lf(context.Background(), logging.LevelInfo, "finished call", logging.MethodFieldKey, "Run", "grpc.code", "Unavailable")
	if got := strings.Count(buf.String(), "\n"); got != 2 {
		t.Fatalf("1,000 refusals and one UNAVAILABLE in a second wrote %d lines, want 2:\n%s", got, buf.String())
	}
	buf.Reset()
	now = now.Add(time.Second)
	lf(context.Background(), logging.LevelInfo, "finished call", logging.MethodFieldKey, "Run", "grpc.code", "ResourceExhausted")
	if !strings.Contains(buf.String(), `"suppressed":999`) {
		t.Errorf("next refusal a second later wrote %q, want suppressed 999", buf.String())
	}
}
